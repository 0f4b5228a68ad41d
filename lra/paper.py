"""The published tables this harness reproduces: their rows, in their order, with labels and test accuracies.

* Table 3 of the YOSO paper (Zeng et al., ICML 2021): ``experiment=table3`` sweeps its rows,
  ``python -m lra.table`` lays them out (``table3.*``).
* Table 1 of the Long Range Arena paper (Tay et al., ICLR 2021; the numbers of its repository's
  README "as of 8 Nov 2020"): ``experiment=lra_table1`` sweeps its rows, ``python -m lra.table
  --paper lra_table1`` lays them out (``lra_table1.*``). Path-X is not a column: every row of it
  FAILed there.

A row is named by its preset in ``conf/attention/`` (``attention=<row>``). The sweeps read the rows
through the resolver ``lra_paper_rows`` (:mod:`lra.config`): ``${lra_paper_rows:lra_table1}``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    preset: str  # conf/attention/<preset>.yaml
    label: str  # as the paper prints it
    accuracy: dict[str, float]  # test accuracy (%) per task


@dataclass(frozen=True)
class PaperTable:
    name: str  # the tables' files, <name>.{md,csv,tex,png}, and the experiment that sweeps the rows
    title: str  # "Table 3"
    source: str  # the paper, as the legend names it
    rows: tuple[Row, ...]
    # The protocol of ours (conf/task/<task>.yaml's protocol.name) that is the paper's: a section of it, with the
    # paper's model, compares with the paper's numbers as equals. None: none of ours is; its numbers are a reference in
    # every section.
    protocol: str | None
    protocol_words: str  # the paper's protocol, as the tables' legend names it

    @property
    def presets(self) -> tuple[str, ...]:
        return tuple(row.preset for row in self.rows)

    def number(self, preset: str, task: str) -> float:
        """The paper's test accuracy (%) of a row and task: for one of its rows as the preset defines it (``yoso_32``),
        not for a changed or split one (``yoso_32 attention.num_hashes=16``); NaN where it has none."""
        row = next((row for row in self.rows if row.preset == preset), None)
        return row.accuracy.get(task, float("nan")) if row else float("nan")

    def label(self, preset: str) -> str:
        return next((row.label for row in self.rows if row.preset == preset), preset)


def _row(preset: str, label: str, listops: float, text: float, retrieval: float, image: float, pathfinder: float) -> Row:
    return Row(preset, label, dict(listops=listops, text=text, retrieval=retrieval, image=image, pathfinder=pathfinder))


TABLE3 = PaperTable(
    "table3",
    "Table 3",
    "the YOSO paper's Table 3",
    (
        _row("none", "none", 19.20, 61.11, 74.78, 33.86, 66.51),
        _row("softmax", "softmax", 37.10, 65.02, 79.35, 38.20, 74.16),
        _row("yoso_e", "yoso-e", 37.30, 64.71, 81.16, 39.78, 72.90),
        _row("nystromformer", "nystromformer", 37.15, 65.52, 79.56, 41.58, 70.94),
        _row("longformer", "longformer", 37.20, 64.60, 80.97, 39.06, 73.01),
        _row("linformer", "linformer", 37.25, 55.91, 79.37, 37.84, 67.60),
        _row("reformer", "reformer", 19.05, 64.88, 78.64, 43.29, 69.36),
        _row("performer", "performer", 18.80, 63.81, 78.62, 37.07, 69.87),
        _row("yoso_32", "yoso-32", 37.25, 63.12, 78.69, 40.21, 72.33),
        _row("yoso_c_16", "yoso-C-16", 37.40, 64.28, 77.61, 44.67, 71.86),
        _row("yoso_star_16", "*yoso-16", 37.20, 62.97, 79.02, 40.50, 72.05),
        _row("yoso_star_c_16", "*yoso-C-16", 37.35, 65.89, 78.80, 45.93, 71.39),
    ),
    protocol="paper",
    protocol_words="its full protocol (`experiment=paper`)",
)

# In the LRA paper's order (Transformer first). Its Transformer is our softmax row; its Sparse
# Transformer ran the causal masks of LRA's code (preset sparse_transformer_lra_causal, see
# conf/attention/sparse_transformer.yaml).
LRA_TABLE1 = PaperTable(
    "lra_table1",
    "LRA Table 1",
    "the Long Range Arena paper's Table 1 (Tay et al., ICLR 2021)",
    (
        _row("softmax", "Transformer", 36.37, 64.27, 57.46, 42.44, 71.40),
        _row("local", "Local Attention", 15.82, 52.98, 53.39, 41.46, 66.63),
        _row("sparse_transformer", "Sparse Trans.", 17.07, 63.58, 59.59, 44.24, 71.71),
        _row("longformer", "Longformer", 35.63, 62.85, 56.89, 42.22, 69.71),
        _row("linformer", "Linformer", 35.70, 53.94, 52.27, 38.56, 76.34),
        _row("reformer", "Reformer", 37.27, 56.10, 53.40, 38.07, 68.50),
        _row("sinkhorn", "Sinkhorn Trans.", 33.67, 61.20, 53.83, 41.23, 67.45),
        _row("synthesizer", "Synthesizer", 36.99, 61.68, 54.67, 41.61, 69.45),
        _row("bigbird", "BigBird", 36.05, 64.02, 59.29, 40.83, 74.87),
        _row("linear_transformer", "Linear Trans.", 16.13, 65.90, 53.09, 42.34, 75.30),
        _row("performer", "Performer", 18.01, 65.40, 53.82, 42.77, 77.05),
    ),
    # LRA trained JAX models of its own per task (ListOps: 4 layers of width 512, CLS pooling, lr 0.05 with rsqrt
    # decay); our protocol `paper` is the YOSO paper's (2 layers of width 64, mean pooling, lr 1e-4).
    protocol=None,
    protocol_words="LRA's own protocol (its JAX models: on ListOps 4 layers of width 512, CLS pooling, lr 0.05), "
    "which no protocol here reproduces",
)

TABLES = {table.name: table for table in (TABLE3, LRA_TABLE1)}
