"""Building the kernels: two libraries, a broken CUDA toolchain never costs the CPU kernels,
YOSO_KERNELS=require makes a failure an error, concurrent and killed builds leave a usable cache,
and no compiler means the reference."""

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from yoso_cuda import build, ops

USE_OPS = (
    "import torch, attention_zoo; from yoso_cuda import ops; report = ops.kernels(); "
    "attn = attention_zoo.build('yoso', seq_len=64, num_heads=2, head_dim=16, num_hashes=4); "
    "out = attn(*(torch.randn(1, 2, 64, 16) for _ in range(3))); "
    "print('cpu kernels:', report.cpu.loaded, 'finite:', bool(torch.isfinite(out).all()))"
)
needs_cuda_torch = pytest.mark.skipif(torch.version.cuda is None, reason="torch is a CPU-only build")


def run_python(code, env, **kwargs):
    return subprocess.Popen(
        [sys.executable, "-W", "always", "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs
    )


def fake_toolkit(folder: Path, release: str) -> Path:
    """A CUDA_HOME whose bin/nvcc reports ``release`` and fails to compile anything."""
    nvcc = folder / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "--version" ]; then echo "Cuda compilation tools, release {release}, V{release}.0"; exit 0; fi\n'
        'echo "fake nvcc: no compiler here" >&2\nexit 1\n'
    )
    nvcc.chmod(0o755)
    return folder


def torch_cuda_release(major_offset: int = 0, minor: str | None = None) -> str:
    major, torch_minor = torch.version.cuda.split(".")[:2]
    return f"{int(major) + major_offset}.{minor if minor is not None else torch_minor}"


# ---- the version check and the lock, in process (no build) -------------------------------------


@needs_cuda_torch
def test_a_different_major_cuda_version_says_what_to_install(tmp_path):
    toolkit = fake_toolkit(tmp_path / "cuda", torch_cuda_release(-1, "4"))
    with pytest.raises(build.ToolkitMismatch) as raised:
        build.check_toolkit_version(str(toolkit))
    message = str(raised.value)
    nvcc_major = int(torch.version.cuda.split(".")[0]) - 1
    assert f"is CUDA {nvcc_major}.4 but torch {torch.__version__} was built for CUDA {torch.version.cuda}" in message
    assert f"install a CUDA {nvcc_major + 1}.x toolkit and set CUDA_HOME to it" in message
    assert f"pip install torch --index-url https://download.pytorch.org/whl/cu{nvcc_major}4" in message


@needs_cuda_torch
def test_a_different_minor_cuda_version_is_a_note_and_the_same_is_silent(tmp_path):
    other_minor = "9" if torch_cuda_release().split(".")[1] != "9" else "8"
    note = build.check_toolkit_version(str(fake_toolkit(tmp_path / "minor", torch_cuda_release(0, other_minor))))
    assert note is not None and "same major version" in note
    assert build.check_toolkit_version(str(fake_toolkit(tmp_path / "same", torch_cuda_release()))) is None


def test_an_nvcc_that_cannot_report_its_version_is_a_mismatch(tmp_path):
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text("#!/bin/sh\necho 'nvcc: error while loading shared libraries' >&2\nexit 127\n")
    nvcc.chmod(0o755)
    with pytest.raises(build.ToolkitMismatch, match="--version failed \\(exit 127\\).*error while loading shared libraries"):
        build.check_toolkit_version(str(tmp_path))


def test_the_build_lock_removes_a_stale_torch_lock_and_dies_with_its_holder(tmp_path):
    (tmp_path / "lock").touch()  # what an older torch's killed build leaves behind
    with build.build_lock(tmp_path):
        assert not (tmp_path / "lock").exists()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path; from yoso_cuda.build import build_lock\n"
            "with build_lock(Path(sys.argv[1])):\n    print('held', flush=True); input()",
            str(tmp_path),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with open(tmp_path / "yoso_build.flock") as handle:
            with pytest.raises(BlockingIOError):  # a second builder waits while the first builds...
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            holder.send_signal(signal.SIGKILL)
            holder.wait(timeout=30)
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)  # ...and the OS frees the lock of a killed one
    finally:
        holder.kill()
        holder.wait()


def test_an_unknown_yoso_kernels_setting_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("YOSO_KERNELS", "gpu")
    with pytest.raises(ValueError, match="YOSO_KERNELS='gpu' is not one of 0, auto, cpu, none, off, reference, require"):
        build.build()


# ---- builds in subprocesses, on a copy of this test run's CPU library ------------------------------


@pytest.fixture(scope="module")
def extensions(tmp_path_factory):
    """An extensions folder holding a copy of this test run's built CPU library (so nothing recompiles it)."""
    report = ops.kernels()
    if not report.cpu.loaded:
        pytest.skip(f"the CPU kernels are not built here: {report.cpu.reason}")
    folder = tmp_path_factory.mktemp("extensions")
    shutil.copytree(Path(report.cpu.path).parent, folder / build.LIBRARY_NAMES["cpu"])
    return folder


def yoso_env(extensions, **variables):
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(extensions), "TORCH_CUDA_ARCH_LIST": "9.0", **variables}
    env.pop("CUDA_PATH", None)
    return env


def run_module(env, *args):
    return subprocess.run([sys.executable, "-m", "yoso_cuda", *args], env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@needs_cuda_torch
def test_a_failing_nvcc_costs_only_the_cuda_kernels(extensions, tmp_path):
    env = yoso_env(extensions, CUDA_HOME=str(fake_toolkit(tmp_path / "cuda", torch_cuda_release())))
    stdout, stderr = run_python(USE_OPS, env).communicate(timeout=300)
    assert "cpu kernels: True finite: True" in stdout, stderr[-3000:]
    assert stderr.count("YOSO's compiled kernels are unavailable (cuda: ") == 1, stderr[-3000:]
    assert "fake nvcc: no compiler here" in stderr  # the reason carries the compiler's own message

    process = run_module(env)
    assert process.returncode == 1, "a wanted library is missing"
    assert "cpu kernels: loaded" in process.stdout
    assert "cuda kernels: FAILED: RuntimeError: Error building extension 'yoso_kernels_cuda'" in process.stdout


@pytest.mark.slow
@needs_cuda_torch
def test_another_cuda_major_version_is_reported_before_compiling(extensions, tmp_path):
    toolkit = fake_toolkit(tmp_path / "cuda", torch_cuda_release(-1, "4"))
    process = run_module(yoso_env(extensions, CUDA_HOME=str(toolkit)))
    assert process.returncode == 1, process.stderr[-3000:]
    assert "cpu kernels: loaded" in process.stdout
    cuda_line = next(line for line in process.stdout.splitlines() if line.startswith("cuda kernels:"))
    assert f"{toolkit}/bin/nvcc is CUDA {torch_cuda_release(-1, '4')} but torch" in cuda_line
    assert "the major versions must match" in cuda_line and "--index-url https://download.pytorch.org/whl/cu" in cuda_line


@pytest.mark.slow
@needs_cuda_torch
def test_require_turns_a_failed_cuda_build_into_an_error(extensions, tmp_path):
    env = yoso_env(extensions, CUDA_HOME=str(fake_toolkit(tmp_path / "cuda", torch_cuda_release())), YOSO_KERNELS="require")
    stdout, stderr = run_python(USE_OPS, env).communicate(timeout=300)
    assert "cpu kernels" not in stdout
    assert (
        "KernelBuildError: YOSO_KERNELS=require and YOSO's kernels failed to build: cuda: RuntimeError: Error building" in stderr
    )

    process = run_module(env)
    assert process.returncode == 1
    assert "cpu kernels: loaded" in process.stdout and "cuda kernels: FAILED" in process.stdout


@pytest.mark.slow
def test_require_is_satisfied_by_the_cpu_kernels_where_no_cuda_is_wanted(extensions):
    env = yoso_env(extensions, YOSO_KERNELS="require")
    env.pop("TORCH_CUDA_ARCH_LIST")
    process = run_module(env)
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the CUDA kernels are wanted here")
    assert process.returncode == 0, process.stdout + process.stderr[-3000:]
    assert "cuda kernels: not built: " in process.stdout


@pytest.mark.slow
def test_a_stale_lock_from_a_killed_build_does_not_hang_the_next(extensions):
    (extensions / build.LIBRARY_NAMES["cpu"] / "lock").touch()
    env = yoso_env(extensions, YOSO_KERNELS="cpu")
    start = time.monotonic()
    process = run_module(env)  # the timeout turns a hang into a failure
    assert process.returncode == 0, process.stdout + process.stderr[-3000:]
    assert "cpu kernels: loaded" in process.stdout
    assert time.monotonic() - start < 120


def test_the_cuda_library_adds_a_cuda_kernel_to_every_op():
    """Where the CUDA kernels are wanted (CI sets TORCH_CUDA_ARCH_LIST), this test run loaded them
    after the CPU library (compiled once, by `python -m yoso_cuda` in CI, then cached)."""
    report = ops.kernels()
    if not report.cuda.wanted:
        pytest.skip(f"no CUDA kernels wanted here: {report.cuda.reason}")
    assert report.cpu.loaded and report.cuda.loaded, report.cuda.reason
    for name in (
        "hash_codes",
        "lsh_cumulation",
        "lsh_weighted_cumulation",
        "lsh_weighted_cumulation_both",
        "lsh_collided_gradient",
    ):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"yoso::{name}", "CUDA"), name
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"yoso::{name}", "CPU"), name


# ---- the reference fallback and concurrent builds (each compiles the CPU library afresh) ----------


@pytest.mark.slow
def test_concurrent_processes_build_once_and_both_load(tmp_path):
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path / "extensions"), "YOSO_KERNELS": "cpu"}
    processes = [run_python(USE_OPS, env) for _ in range(2)]
    outputs = [process.communicate(timeout=600) for process in processes]
    for process, (stdout, stderr) in zip(processes, outputs):
        assert process.returncode == 0, stderr[-2000:]
        assert "cpu kernels: True finite: True" in stdout
    libraries = list((tmp_path / "extensions").rglob("*.so"))
    assert len(libraries) == 1, libraries


@pytest.mark.slow
def test_without_a_compiler_import_works_and_yoso_runs_on_the_reference(tmp_path):
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path / "extensions"), "YOSO_KERNELS": "cpu", "CXX": "/bin/false"}
    stdout, stderr = run_python(USE_OPS, env).communicate(timeout=300)
    assert "cpu kernels: False finite: True" in stdout, stderr[-2000:]
    assert stderr.count("YOSO's compiled kernels are unavailable") == 1
    assert "python -m yoso_cuda" in stderr


def test_the_built_library_shares_torchs_cpp_runtime():
    report = ops.kernels()
    if not report.cpu.loaded or not sys.platform.startswith("linux"):
        pytest.skip("needs the CPU kernels built on Linux")
    needed = build.needed_libraries(Path(report.cpu.path))
    assert "libc10.so" in needed and any(name.startswith(("libstdc++", "libc++")) for name in needed), needed
    assert report.cpu.unsafe is None and build.private_cpp_runtime(Path(report.cpu.path)) is None
    assert build.needed_libraries(Path(__file__)) is None  # not an ELF file


def static_cxx(folder: Path) -> Path:
    """A CXX wrapper that links libstdc++ statically, as an H100 machine's /opt/gcc/bin/g++ did (2026-11-25);
    skips where this machine's compiler cannot."""
    if shutil.which("c++") is None or not sys.platform.startswith("linux"):
        pytest.skip("needs a C++ compiler on Linux")
    wrapper = folder / "static-cxx"
    wrapper.write_text('#!/bin/sh\nexec c++ "$@" -static-libstdc++\n')
    wrapper.chmod(0o755)
    # Checked by hand, not with the probe under test: a library the wrapper links must carry libstdc++.
    (folder / "check.cpp").write_text(build.PROBE_SOURCE)
    linked = subprocess.run([str(wrapper), "-shared", "-fPIC", str(folder / "check.cpp"), "-o", str(folder / "check.so")])
    if linked.returncode != 0 or build.carries_cpp_runtime(folder / "check.so") is not True:
        pytest.skip("this compiler cannot link libstdc++ statically into a shared library")
    return wrapper


def test_the_probe_tells_a_static_libstdcxx_compiler_from_a_dynamic_one(tmp_path, monkeypatch):
    wrapper = static_cxx(tmp_path)
    assert build.links_cpp_runtime_statically(str(wrapper)) is True
    safe = next((found for name in build.SYSTEM_COMPILERS if (found := shutil.which(name))), None)
    assert safe is not None and build.links_cpp_runtime_statically(safe) is False
    assert build.links_cpp_runtime_statically(str(tmp_path / "no-such-compiler")) is None

    monkeypatch.setenv("CXX", str(wrapper))
    environment, note = build.compiler_override()
    assert environment["CXX"] == safe and build.links_cpp_runtime_statically(environment["CXX"]) is False
    assert f"CXX={wrapper} links libstdc++ statically" in note and f"built with CXX={safe}" in note
    monkeypatch.setattr(build, "SYSTEM_COMPILERS", (str(wrapper),))  # no safe compiler left to fall back on
    assert build.compiler_override() == ({}, None)
    monkeypatch.setenv("CXX", safe)  # a safe CXX is kept as it is
    assert build.compiler_override() == ({}, None)


def test_the_environment_is_restored_after_the_build(monkeypatch):
    monkeypatch.setenv("CXX", "before")
    monkeypatch.delenv("CC", raising=False)
    with build.environment({"CXX": "during", "CC": "during-cc"}):
        assert (os.environ["CXX"], os.environ["CC"]) == ("during", "during-cc")
    assert os.environ["CXX"] == "before" and "CC" not in os.environ


@pytest.mark.slow
def test_a_cxx_that_links_libstdcxx_statically_gives_way_to_a_system_compiler(tmp_path):
    """An H100 machine's CXX (2026-11-25) linked libstdc++ statically and every error the kernels raised
    segfaulted; a window's build then refused. Here such a wrapper builds for real: the build takes
    a system compiler instead, says so, and the library shares torch's C++ runtime."""
    wrapper = static_cxx(tmp_path)
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path / "extensions"), "CXX": str(wrapper), "YOSO_KERNELS": "cpu"}
    process = run_module(env)
    assert process.returncode == 0, process.stdout + process.stderr[-2000:]
    line = next(line for line in process.stdout.splitlines() if line.startswith("cpu kernels:"))
    assert line.startswith("cpu kernels: loaded (") and "UNSAFE" not in line, line
    assert f"note: CXX={wrapper} links libstdc++ statically" in process.stdout
    library = next((tmp_path / "extensions").rglob("yoso_kernels_cpu.so"))
    assert build.private_cpp_runtime(library) is None
    assert any(name.startswith("libstdc++") for name in build.needed_libraries(library))


@pytest.mark.slow
def test_without_a_safe_compiler_the_library_is_unsafe_and_require_fails(tmp_path):
    wrapper = static_cxx(tmp_path)
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path / "extensions"), "CXX": str(wrapper), "YOSO_KERNELS": "cpu"}
    only_the_wrapper = f"from yoso_cuda import build; build.SYSTEM_COMPILERS = ({str(wrapper)!r},); "
    stdout, stderr = run_python(
        only_the_wrapper + "import runpy, sys; sys.argv = ['yoso_cuda']; runpy.run_module('yoso_cuda', run_name='__main__')",
        env,
    ).communicate(timeout=300)
    assert "Building YOSO's cpu kernels (once, until their sources change" in stderr  # a first build says so
    line = next(line for line in stdout.splitlines() if line.startswith("cpu kernels:"))
    assert "UNSAFE: it links its own static copy of the C++ standard library" in line
    assert f"the compiler {wrapper} (from CXX) links libstdc++ statically" in line
    assert "set CXX to a compiler that links it dynamically" in line

    stdout, stderr = run_python(
        only_the_wrapper + "from yoso_cuda import ops; ops.kernels()", {**env, "YOSO_KERNELS": "require"}
    ).communicate(timeout=300)
    assert "KernelBuildError: YOSO_KERNELS=require and YOSO's kernels failed to build: cpu: it links its own" in stderr


def test_a_library_older_than_a_source_or_header_needs_compiling(tmp_path):
    library = tmp_path / "lib.so"
    source = tmp_path / "a.cpp"
    source.write_text("")
    assert build.needs_compiling(library, [source])  # missing
    library.write_bytes(b"")
    newest_input = max(path.stat().st_mtime for path in [source, *build.SOURCES.glob("*.h")])
    os.utime(library, (newest_input + 10, newest_input + 10))
    assert not build.needs_compiling(library, [source])
    os.utime(source, (newest_input + 20, newest_input + 20))
    assert build.needs_compiling(library, [source])
