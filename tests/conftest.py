"""Session fixtures shared by the tests: a tiny HF model built locally (no downloads)."""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

# One cache folder for the whole session, so the CLI tests build the embedded tiny model once.
# Tests must never read or write the user's ~/.cache/agentq.
if "AGENTQ_TEST_CACHE" not in os.environ:
    import tempfile
    os.environ["AGENTQ_TEST_CACHE"] = tempfile.mkdtemp(prefix="agentq-test-cache-")
os.environ["AGENTQ_CACHE"] = os.environ["AGENTQ_TEST_CACHE"]
# glibc's malloc settings last for the process: the commands tests run in this one (`main([...])`) leave
# pytest's malloc as it is; `run_cli`'s subprocesses drop this and run as a user's (tuned)
os.environ["AGENTQ_MALLOC_TUNING"] = "0"

REPO = Path(__file__).resolve().parents[1]

CORPUS = [
    "You are in the kitchen. In one part of the room you see a stove. There is also an oven. "
    "You also see a fridge that is closed. To the East you see the pantry. To the West you see the corridor.",
    "Your task is to search the environment and find the coin. Once you find the coin, take it.",
    "<action>look around</action> <action>move east</action> <action>take coin</action> "
    "<action>open door to north</action> <action>inventory</action>",
    "Actions: close door to east, close door to north, inventory, look around, move east, move north, move west",
] * 20


@pytest.fixture(autouse=True)
def _split_tasks_listed_afresh():
    """Each test lists its splits itself: `build.split_tasks` keeps a process's listings, and one
    test's (its env variables, data folders, monkeypatched env) must not answer the next one's."""
    build = sys.modules.get("agentq.build")        # not imported yet: nothing listed
    if build is not None:
        build.forget_split_tasks()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A 2-layer random-init Qwen3 (hidden 256, GQA 4:2, head_dim 64) + a BPE tokenizer with ChatML."""
    from agentq.models.tiny import TinyModelConfig, build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny", CORPUS, TinyModelConfig(vocab_size=512))


@pytest.fixture
def two_episode_batch():
    """Two one-turn episodes of one GRPO group (4 prompt tokens, 3 sampled), advantages +1 / -1: a
    PolicyBatch for the learner tests."""
    import torch

    from agentq.agent.trajectory import Trajectory
    from agentq.learner.batch import collate

    trajs = []
    for i in range(2):
        t = Trajectory(episode_id=i, task_id="t", split="train", group_id=0)
        t.append([5, 6, 7, 8], sampled=False)
        t.append([9, 10, 11], sampled=True, seg=1, logps=[-1.0, -1.2, -0.9])
        trajs.append(t)
    return collate(trajs, torch.tensor([1.0, -1.0]))


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def run_cli(args: list[str], cwd: Path | None = None, timeout: int = 900, extra_env: dict | None = None):
    """Run `python -m agentq.cli ...` in a subprocess (as a user would), returning CompletedProcess."""
    import subprocess

    env = {**{k: v for k, v in os.environ.items() if k != "AGENTQ_MALLOC_TUNING"}, **(extra_env or {})}
    return subprocess.run([sys.executable, "-m", "agentq.cli", *args], cwd=cwd or REPO, env=env, timeout=timeout,
                          capture_output=True, text=True)


def malloc_tuning_in_a_child() -> str:
    """What `tune_malloc` does in a fresh process here ("on (...)", or "off: <why>"): tests of the tuned
    heap skip where this glibc refuses it."""
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "AGENTQ_MALLOC_TUNING"}
    code = "from agentq.utils.malloc_tuning import tune_malloc; print(tune_malloc())"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                          check=True).stdout.strip()


def chromium() -> tuple[str, str] | None:
    """(browser, chromedriver) paths, or None when Chromium is not installed."""
    import shutil

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


NO_CHROMIUM = "needs Chromium and ChromeDriver (apt-get install -y chromium chromium-driver)"


def headless_chromium(profile_dir: Path):
    """A selenium driver of headless Chromium (the caller quits it); skips without selenium."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="needs selenium (pip install selenium)")
    from selenium.webdriver.chrome.service import Service

    browser, driver_path = chromium()
    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1200,1000",
                f"--user-data-dir={profile_dir}"):
        opts.add_argument(arg)
    return webdriver.Chrome(service=Service(driver_path), options=opts)


@pytest.fixture(scope="module")
def ray_cluster():
    """A small local Ray cluster (2 CPUs) for one test module (tests/distributed/); always shut down."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        ray.shutdown()
    # "local": a new cluster even where /tmp/ray/ray_current_cluster names another, or a dead one (a
    # cluster killed earlier leaves it); plain ray.init() would join that and refuse num_cpus
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield ray
    finally:
        ray.shutdown()


#: the modules of the W8A8 GEMM and the norms that read its outputs, reloaded interpreted together
GEMM_NORM_MODULES = ("agentq.kernels.triton_quant", "agentq.kernels.triton_gemm", "agentq.kernels.triton_norm")


@pytest.fixture
def failing_capture(monkeypatch):
    """`patch(module)` makes that module's `capture_graph` fail as a GPU's capture may (a CPU cannot
    build a CUDA graph, so this stand-in is the only way to reach the fallback there); returns the
    list of attempted captures. The engine's prefill and weight-sync graph tests use it."""
    import torch

    def patch(module, message: str = "CUDA out of memory") -> list:
        attempts: list = []

        def refuse(fn, pool):
            attempts.append(pool)
            raise RuntimeError(message)
        monkeypatch.setattr(module, "capture_graph", refuse)
        monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: "pool")
        return attempts
    return patch


@pytest.fixture
def disk_full_at(monkeypatch):
    """`disk_full_at("train_summary.json")`: from then on, `Path.write_text` of that file (or of a
    temporary `.train_summary.json.*` beside it) writes half the text and raises OSError ENOSPC, as a
    write to a full disk does. Returns the list of the names it cut short. The tests of the files a run
    replaces whole use it."""
    import errno

    real = Path.write_text

    def arm(name: str) -> list[str]:
        cut: list[str] = []

        def write_text(self, data, *args, **kwargs):
            if self.name != name and not self.name.startswith(f".{name}."):
                return real(self, data, *args, **kwargs)
            real(self, data[:len(data) // 2], *args, **kwargs)
            cut.append(self.name)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        monkeypatch.setattr(Path, "write_text", write_text)
        return cut
    return arm


def _interpreter_takes_loaded_loop_bounds() -> bool:
    """Whether Triton's interpreter runs `for i in range(lo, hi, ...)` with a bound computed inside
    the kernel (the prefill kernel's loaded key bound, the GEMM's K slice of a split): Triton 3.6's
    interpreter turns such a bound into a 1-element array, which numpy ≥ 2.4 refuses to make an int
    (tried: 3.6 with numpy 2.3 runs it, 3.6 with 2.4 does not, 3.9 with 2.4 does; the GPU machine
    has 3.6 with numpy 2.5)."""
    try:
        import numpy
        import triton
        from packaging.version import Version
    except ImportError:
        return True
    return Version(triton.__version__).release >= (3, 9) or Version(numpy.__version__).release < (2, 4)


#: for interpreted tests that run the prefill or GEMM kernels inside an engine (their compiled
#: counterparts are in tests/rollout/test_engine_cuda.py)
NEEDS_INTERPRETED_LOOP_BOUNDS = pytest.mark.skipif(
    not _interpreter_takes_loaded_loop_bounds(),
    reason="this Triton's interpreter cannot take a computed scalar as a loop bound under numpy >= 2.4 (Triton 3.9 can)")


@pytest.fixture(scope="module")
def gemm_norm_kernels():
    """(triton_quant, triton_gemm, triton_norm) under TRITON_INTERPRET=1 for one test module: CPU
    tests of what the kernels compute (skipped on a machine with a GPU, which runs them compiled)."""
    import torch

    from agentq.kernels import _interp
    if torch.cuda.is_available():
        pytest.skip("CPU interpreter test (the GPU machine runs the compiled kernels)")
    tq, tg, tn = _interp.load_interpreted(GEMM_NORM_MODULES)
    assert _interp.runs_interpreted(tg._w8a8_gemm_kernel) and _interp.runs_interpreted(tn._add_rms_norm_kernel)
    yield tq, tg, tn
    _interp.restore_compiled(GEMM_NORM_MODULES)


def stop_rl_at_step(monkeypatch, n: int, stop: BaseException | None = None) -> None:
    """Make every RL run of this test raise `stop` (default: Ctrl-C, `KeyboardInterrupt`) as its step `n`
    begins, steps before it running as usual; `monkeypatch.undo()` ends it."""
    from agentq.trainer import rl

    step = rl.RLTrainer.step

    def stopped(self, k):
        if k == n:
            raise stop if stop is not None else KeyboardInterrupt
        return step(self, k)

    monkeypatch.setattr(rl.RLTrainer, "step", stopped)


def train_run(tmp_path_factory, args: list[str]) -> Path:
    """`agentq train <args>` into a fresh run folder (asserting it succeeded); returns the folder."""
    out = tmp_path_factory.mktemp("run") / "r"
    p = run_cli(["train", *args, f"trainer.out_dir={out}"])
    assert p.returncode == 0, p.stderr[-3000:]
    (out.parent / "train.stderr").write_text(p.stderr)       # what the user saw, beside the run folder
    return out


@contextlib.contextmanager
def ray_head(cwd: Path, num_cpus: int = 1):
    """A `ray start --head --block` cluster on a free port in its own process group, as a user starts
    one, for `ray.address=auto` to join (`ray start` points it there through
    /tmp/ray/ray_current_cluster). Stopped afterwards, and that file put back as it was.
    Yields the head's port."""
    marker = Path("/tmp/ray/ray_current_cluster")
    before = marker.read_text() if marker.exists() else None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ray_cli = os.path.join(os.path.dirname(sys.executable), "ray")
    head = subprocess.Popen([ray_cli, "start", "--head", f"--port={port}", f"--num-cpus={num_cpus}",
                             "--include-dashboard=false", "--block"], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and head.poll() is None:
            if "Ray runtime started" in head.stdout.readline().decode(errors="replace"):
                break
        else:
            raise AssertionError("the `ray start` head did not come up")
        yield port
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait(timeout=30)
        if before is None:
            marker.unlink(missing_ok=True)
        else:
            marker.write_text(before)


def one_task_env(name: str, splits: tuple[str, ...], init: str = "") -> str:
    """Python source of a TextEnv class `name` with one task, "a", won by any first action (a probe
    for registration and config checks); `init`: an `__init__` to put in the class, indented."""
    return f'''
class {name}(TextEnv):
    splits = {splits!r}
{init}
    def _tasks(self, split):
        return ["a"]

    def _reset_task(self, task_id, split):
        return "goal", TaskStep(obs="start")

    def _step_task(self, action):
        return TaskStep(obs="end", done=True, won=True)
'''


#: Python source of a module of TextEnvs (`shared_split_env.py` in the tests) whose "test" split shares
#: 2 of its 4 task ids with "train" (Shared) or none (Apart): the held-out overlap warning's probes
SHARED_SPLITS_ENV = "from agentq.envs import TaskStep, TextEnv\n" + one_task_env("Base", ("train", "test")) + """

class Shared(Base):
    def _tasks(self, split):
        return ["a", "b", "c"] if split == "train" else ["c", "d", "a", "e"]


class Apart(Base):
    def _tasks(self, split):
        return ["a", "b"] if split == "train" else ["c"]
"""
