"""No file written through a link prompt-r1 did not make (issue 51, item 2): a stale temporary
(`NAME.manifest.json.writing`, a summary's `.writing`, `.compacting`, a cache's `.creating`) or lock file
(`NAME.jsonl.lock`, a folder's `.prompt-r1.lock`) that is a symbolic link leaves the file it points to untouched,
and the one-writer lock holds per real output, whatever path spells it. Real files, symlinks and processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from batch_setup import cli_args
from helpers import ROOT, rows_of, run_cli, write_questions

from prompt_r1.core.errors import OutputError
from prompt_r1.runs.output_lock import hold_output

pytestmark = pytest.mark.usefixtures("batch_key")

PRECIOUS = "another user's file: must stay as it is\n"


def victim(tmp_path: Path) -> Path:
    path = tmp_path / "elsewhere" / "precious.txt"
    path.parent.mkdir(exist_ok=True)
    path.write_text(PRECIOUS)
    return path


def test_a_stale_manifest_and_summary_temporary_that_is_a_link_is_not_followed(tmp_path, relay_server):
    target = victim(tmp_path)
    inp, out = write_questions(tmp_path / "q.jsonl", 2), tmp_path / "out.jsonl"
    for stale in ("out.manifest.json.writing", "out.summary.json.writing"):
        (tmp_path / stale).symlink_to(target)
    code, _, err = run_cli(cli_args(relay_server.base_url, inp, out))
    assert code == 0, err
    assert target.read_text() == PRECIOUS
    assert (tmp_path / "out.manifest.json").is_file() and not (tmp_path / "out.manifest.json").is_symlink()
    assert (tmp_path / "out.summary.json").is_file() and len(rows_of(out)) == 2
    assert not (tmp_path / "out.manifest.json.writing").exists()


@pytest.mark.parametrize("link", ["symlink", "hardlink"])
def test_a_lock_file_that_is_a_link_is_refused_in_one_line_and_its_target_untouched(
    tmp_path, relay_server, link
):
    target = victim(tmp_path)
    inp, out = write_questions(tmp_path / "q.jsonl", 2), tmp_path / "out.jsonl"
    lock = tmp_path / "out.jsonl.lock"
    lock.symlink_to(target) if link == "symlink" else os.link(target, lock)
    code, _, err = run_cli(cli_args(relay_server.base_url, inp, out))
    assert code == 2 and err.strip().count("\n") == 0 and "Traceback" not in err, err
    assert f"{lock}" in err and "prompt-r1 never makes" in err
    assert target.read_text() == PRECIOUS and not out.exists() and relay_server.requests == []


def test_a_folders_lock_that_is_a_link_is_refused_and_its_target_untouched(tmp_path):
    target = victim(tmp_path)
    folder = tmp_path / "eval"
    folder.mkdir()
    (folder / ".prompt-r1.lock").symlink_to(target)
    with pytest.raises(OutputError, match="is a symbolic link"), hold_output(folder, "--out", folder=True):
        pass
    assert target.read_text() == PRECIOUS


def hold_in_another_process(output: Path, *, folder: bool = False) -> subprocess.Popen:
    code = (
        "import time\nfrom prompt_r1.runs.output_lock import hold_output\n"
        f"with hold_output({str(output)!r}, '--out', folder={folder}):\n    print('held', flush=True)\n"
        "    time.sleep(300)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


@pytest.mark.parametrize("spelling", ["linked-file", "linked-folder", "dangling-link"])
def test_one_output_reached_through_a_link_has_one_writer(tmp_path, spelling):
    real_folder = tmp_path / "real"
    real_folder.mkdir()
    real = real_folder / "results.jsonl"
    if spelling == "linked-file":
        real.write_text("")
        other = tmp_path / "link.jsonl"
        other.symlink_to(real)
    elif spelling == "linked-folder":
        (tmp_path / "linked").symlink_to(real_folder, target_is_directory=True)
        other = tmp_path / "linked" / "results.jsonl"
    else:  # a link to a results file not made yet: the run would write where it points
        other = tmp_path / "ahead.jsonl"
        other.symlink_to(real)
    holder = hold_in_another_process(real)
    try:
        with pytest.raises(OutputError, match=f"pid {holder.pid} on "), hold_output(other, "--out"):
            pass
    finally:
        holder.kill()
        holder.wait()


def test_a_folder_reached_through_a_link_has_one_writer(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "real", target_is_directory=True)
    holder = hold_in_another_process(tmp_path / "real", folder=True)
    try:
        alias = hold_output(tmp_path / "alias", "--out", folder=True)
        with pytest.raises(OutputError, match="being written by another run"), alias:
            pass
    finally:
        holder.kill()
        holder.wait()


def test_leftover_temporaries_that_are_links_are_not_followed(tmp_path):
    from prompt_r1.clients.response_cache import open_cache
    from prompt_r1.runs.output_files import compact_output

    target = victim(tmp_path)
    results = tmp_path / "r.jsonl"
    results.write_text('{"id": "a", "status": "failed"}\n{"id": "a", "status": "answered"}\n')
    (tmp_path / "r.jsonl.compacting").symlink_to(target)
    assert compact_output(results) == 1
    cache = tmp_path / "c.sqlite"
    (tmp_path / "c.sqlite.creating").symlink_to(target)  # the name earlier versions used for every process
    open_cache(cache, ["http://127.0.0.1:1/v1"]).close()
    assert target.read_text() == PRECIOUS
    assert not results.is_symlink() and rows_of(results) == [{"id": "a", "status": "answered"}]
