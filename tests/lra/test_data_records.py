"""``lra.data.records``: what a data folder held when written, and the first way it differs now."""

from lra.data import records


def write_folder(root, images=records.FILES_PER_ENTRY + 1):
    (root / "imgs" / "0").mkdir(parents=True)
    for i in range(images):
        (root / "imgs" / "0" / f"sample_{i}.png").write_bytes(bytes([i % 256]) * 7)
    (root / "basic_train.tsv").write_text("Source\tTarget\n1\t1\n")
    (root / "generator.json").write_text("{}")


def test_a_large_folder_is_one_entry_and_the_record_skips_its_own_file(tmp_path):
    write_folder(tmp_path)
    record = records.describe(tmp_path, counts={"basic_train.tsv": 1}, skip=("generator.json",))
    assert sorted(record) == ["basic_train.tsv", "imgs/0/"]
    assert record["imgs/0/"]["num_files"] == records.FILES_PER_ENTRY + 1 and record["imgs/0/"]["num_bytes"] == 7 * 101
    assert record["basic_train.tsv"]["num_samples"] == 1
    assert records.difference(tmp_path, record, "generator.json") is None
    (tmp_path / "notes.txt").write_text("a file the record does not list is not its business")
    assert records.difference(tmp_path, record, "generator.json") is None


def test_each_kind_of_difference_is_named(tmp_path):
    write_folder(tmp_path)
    record = records.describe(tmp_path, skip=("generator.json",))
    image = tmp_path / "imgs" / "0" / "sample_3.png"
    image.write_bytes(b"\x00" * 7)  # same size, other bytes
    assert records.difference(tmp_path, record, "generator.json").startswith(
        "imgs/0/ has other contents than generator.json records (SHA-256"
    )
    image.unlink()
    assert records.difference(tmp_path, record, "generator.json") == (
        "imgs/0/ holds 100 files, 700 bytes (generator.json records 101 files, 707 bytes)"
    )
    (tmp_path / "basic_train.tsv").unlink()
    assert records.difference(tmp_path, record, "x.json").startswith("basic_train.tsv is missing (x.json records")
