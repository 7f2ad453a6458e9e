"""Working folders and file-safe names (reservoir/paths.py)."""

from __future__ import annotations

from pathlib import Path

from reservoir.paths import cache_dir, default_data_dir, features_dir, file_task_path, results_dir, slug


def test_folders_follow_reservoir_home_and_the_cache_its_own_variable_first(tmp_path, monkeypatch):
    monkeypatch.delenv("RESERVOIR_CACHE", raising=False)
    monkeypatch.delenv("RESERVOIR_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    assert default_data_dir() == Path("data") and features_dir() == Path("features")
    assert cache_dir() == tmp_path / "user" / ".cache" / "reservoir"
    monkeypatch.setenv("RESERVOIR_HOME", str(tmp_path / "home"))
    assert default_data_dir() == tmp_path / "home" / "data"
    assert cache_dir() == tmp_path / "home" / "cache"
    assert results_dir("digits", "gpt2") == tmp_path / "home" / "results" / "digits" / "gpt2"
    monkeypatch.setenv("RESERVOIR_CACHE", str(tmp_path / "elsewhere"))
    assert cache_dir() == tmp_path / "elsewhere"


def test_a_file_task_gives_its_path_and_any_other_name_none():
    assert file_task_path("file:data/my rows.parquet") == "data/my rows.parquet"
    assert file_task_path("file:") == ""
    assert [file_task_path(name) for name in ("digits", "hf:file:x", None, 3)] == [None] * 4


def test_slugs_are_file_safe_and_drop_prefixes_and_folders(tmp_path, monkeypatch):
    folder = tmp_path / "my model"
    folder.mkdir()
    assert slug("hf:openai-community/gpt2") == "gpt2"
    assert slug(f"file:{tmp_path / 'rows.parquet'}") == slug("file:rows.parquet") == "rows.parquet"
    (tmp_path / "rows.parquet").write_bytes(b"")
    (tmp_path / "model.v2").mkdir()
    monkeypatch.chdir(tmp_path)  # the same names from the folder holding them
    assert slug("file:rows.parquet") == "rows.parquet" and slug("model.v2") == "model.v2"
    assert slug(f"{folder}/") == "my--model"
    assert slug("bit_xor") == "bit_xor"
    assert slug("a b*c") == "a--b--c"
