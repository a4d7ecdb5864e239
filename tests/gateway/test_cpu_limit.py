"""The checker pool is sized by the cores chatgate may use: a container's CPU limit (cgroup v2 `cpu.max`,
v1 `cpu.cfs_quota_us`), read from fake cgroup trees here (docs/production.md#kubernetes)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from chatgate.gateway.checking import cgroup_cpu_limit, checker_count, usable_cpus


def v2(tmp_path: Path, cpu_max: str | None, path: str = "/", nested: bool = False) -> tuple[str, str]:
    root = tmp_path / "cgroup"
    folder = root / path.lstrip("/") if nested else root
    folder.mkdir(parents=True, exist_ok=True)
    if cpu_max is not None:
        (folder / "cpu.max").write_text(cpu_max + "\n")
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text(f"0::{path}\n")
    return str(proc), str(root)


def v1(tmp_path: Path, quota: int, period: int = 100000, path: str = "/docker/abc") -> tuple[str, str]:
    root = tmp_path / "cgroup"
    folder = root / "cpu,cpuacct" / path.lstrip("/")
    folder.mkdir(parents=True)
    (folder / "cpu.cfs_quota_us").write_text(f"{quota}\n")
    (folder / "cpu.cfs_period_us").write_text(f"{period}\n")
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text(f"12:memory:{path}\n4:cpu,cpuacct:{path}\n1:name=systemd:{path}\n")
    return str(proc), str(root)


def machine_cores() -> int:
    return len(os.sched_getaffinity(0))


@pytest.mark.parametrize(
    ("cpu_max", "limit"),
    [("max 100000", None), ("200000 100000", 2.0), ("150000 100000", 1.5), ("50000 100000", 0.5)],
)
def test_v2_cpu_max_in_the_containers_own_namespace(
    tmp_path: Path, cpu_max: str, limit: float | None
) -> None:
    assert cgroup_cpu_limit(*v2(tmp_path, cpu_max)) == limit


def test_v2_cpu_max_under_the_path_proc_names(tmp_path: Path) -> None:
    proc, root = v2(tmp_path, "300000 100000", path="/kubepods/pod1/ctr", nested=True)
    assert cgroup_cpu_limit(proc, root) == 3.0


def test_v1_quota_and_period(tmp_path: Path) -> None:
    assert cgroup_cpu_limit(*v1(tmp_path, 250000)) == 2.5


def test_v1_no_quota(tmp_path: Path) -> None:
    assert cgroup_cpu_limit(*v1(tmp_path, -1)) is None


def test_a_file_not_in_the_kernels_format_is_no_limit(tmp_path: Path) -> None:
    assert cgroup_cpu_limit(*v2(tmp_path / "a", "lots 100000")) is None
    assert cgroup_cpu_limit(*v1(tmp_path / "b", 100000, period=0)) is None


def test_no_cgroup_files(tmp_path: Path) -> None:
    assert cgroup_cpu_limit(str(tmp_path / "missing"), str(tmp_path)) is None
    assert cgroup_cpu_limit(*v2(tmp_path, None)) is None


def test_usable_cpus_takes_the_limit_rounded_up_never_more_than_the_machine(tmp_path: Path) -> None:
    assert usable_cpus(*v2(tmp_path / "a", "50000 100000")) == 1
    assert usable_cpus(*v2(tmp_path / "b", "150000 100000")) == min(2, machine_cores())
    assert usable_cpus(*v2(tmp_path / "c", "6400000 100000")) == machine_cores()
    assert usable_cpus(*v2(tmp_path / "d", "max 100000")) == machine_cores()


@pytest.mark.parametrize(("cores", "checkers"), [(1, 1), (2, 1), (3, 2), (5, 4), (64, 4)])
def test_checker_count(cores: int, checkers: int) -> None:
    assert checker_count(cores) == checkers
