"""Table 3 of the YOSO paper (ICML 2021): its rows, in its order, with their labels and test accuracies.

The one list of the table's rows: ``python -m lra.train -m experiment=table3`` sweeps them (through the
``lra_table3_rows`` resolver, :mod:`lra.config`) and ``lra.table`` lays them out. A row is named by its
preset in ``conf/attention/`` (``attention=<row>``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    preset: str  # conf/attention/<preset>.yaml
    label: str  # as the paper prints it
    accuracy: dict[str, float]  # test accuracy (%) per task


TABLE3 = (
    Row("none", "none", dict(listops=19.20, text=61.11, retrieval=74.78, image=33.86, pathfinder=66.51)),
    Row("softmax", "softmax", dict(listops=37.10, text=65.02, retrieval=79.35, image=38.20, pathfinder=74.16)),
    Row("yoso_e", "yoso-e", dict(listops=37.30, text=64.71, retrieval=81.16, image=39.78, pathfinder=72.90)),
    Row("nystromformer", "nystromformer", dict(listops=37.15, text=65.52, retrieval=79.56, image=41.58, pathfinder=70.94)),
    Row("longformer", "longformer", dict(listops=37.20, text=64.60, retrieval=80.97, image=39.06, pathfinder=73.01)),
    Row("linformer", "linformer", dict(listops=37.25, text=55.91, retrieval=79.37, image=37.84, pathfinder=67.60)),
    Row("reformer", "reformer", dict(listops=19.05, text=64.88, retrieval=78.64, image=43.29, pathfinder=69.36)),
    Row("performer", "performer", dict(listops=18.80, text=63.81, retrieval=78.62, image=37.07, pathfinder=69.87)),
    Row("yoso_32", "yoso-32", dict(listops=37.25, text=63.12, retrieval=78.69, image=40.21, pathfinder=72.33)),
    Row("yoso_c_16", "yoso-C-16", dict(listops=37.40, text=64.28, retrieval=77.61, image=44.67, pathfinder=71.86)),
    Row("yoso_star_16", "*yoso-16", dict(listops=37.20, text=62.97, retrieval=79.02, image=40.50, pathfinder=72.05)),
    Row("yoso_star_c_16", "*yoso-C-16", dict(listops=37.35, text=65.89, retrieval=78.80, image=45.93, pathfinder=71.39)),
)
ROWS = tuple(row.preset for row in TABLE3)
