"""The power-loss harness leaves no mount behind, even when the test left a file open in it.

A plain ``umount`` of a mount still in use fails, and its failure was not checked: a test whose
subprocess still held a store file when the ``disk`` fixture closed left the mount and its loop device
attached after the run (one such mount, of a full-disk gc test, outlived its session by hours).
"""

from __future__ import annotations

from pathlib import Path

from ._power_loss import LoopFs, run


def test_a_disk_closed_while_a_file_in_it_is_open_is_unmounted_and_detached(disk: LoopFs) -> None:
    with open(disk.mount / "held", "w") as held:
        held.write("still open")
        disk.close()
        assert f" {disk.mount} " not in Path("/proc/mounts").read_text(), "still mounted"
    # the loop device is freed once the last file open in it is closed (a lazy unmount's detach waits for it)
    assert str(disk.image) not in run("losetup", "-a").stdout, "its loop device is still attached"
