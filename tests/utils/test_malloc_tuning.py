"""`agentq.utils.malloc_tuning`: glibc keeps large freed blocks in the heap once tuned (no fresh
mmap and page faults per tensor), the opt-out and non-glibc paths leave malloc alone, and the
outcome is decided once per process. mallopt is process-wide, so what changes malloc runs in a
subprocess, never in the pytest process."""
import shutil
import subprocess
import sys

import pytest

from agentq.utils import malloc_tuning

# 40 × (allocate a 64 MiB tensor, write it, free it): the minor faults of each round. Tuned, the heap
# grows for the first few rounds (torch's 64-byte-aligned requests do not fit a freed block of the
# same size until freed neighbours coalesce), then serves every round from freed blocks
CHURN = """
import resource, sys, torch
from agentq.utils.malloc_tuning import tune_malloc
print(tune_malloc())
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
rounds = []
for _ in range(40):
    before = faults()
    t = torch.ones(16 << 20)        # 64 MiB: above glibc's largest dynamic mmap threshold (32 MiB)
    del t
    rounds.append(faults() - before)
print(*rounds)
"""


def churn(env_value: str) -> tuple[str, list[int]]:
    out = subprocess.run([sys.executable, "-c", CHURN], env={**_env(), malloc_tuning.ENV_VAR: env_value},
                         capture_output=True, text=True, timeout=120, check=True).stdout.split("\n")
    return out[0], [int(x) for x in out[1].split()]


def _env() -> dict[str, str]:
    import os
    return {k: v for k, v in os.environ.items() if k != malloc_tuning.ENV_VAR}


@pytest.mark.skipif(malloc_tuning.glibc_version() is None, reason="glibc only")
def test_tuned_heap_reuses_large_blocks_and_opt_out_does_not():
    outcome, tuned = churn("1")
    if "refuses" in outcome:
        pytest.skip(outcome)
    assert outcome.startswith("on (mmap and trim thresholds 1024 MiB"), outcome
    assert sum(tuned[20:]) < 2000, tuned            # freed blocks reused: (almost) no page faulted in again
    outcome, untuned = churn("0")
    assert outcome == f"off: {malloc_tuning.ENV_VAR}=0"
    # each 64 MiB tensor a fresh mmap, faulted in again every round: 16384 pages of 4 KiB, or a few
    # hundred where transparent huge pages back it
    assert min(untuned) > 0 and sum(untuned[20:]) > 5 * (sum(tuned[20:]) + 100), (untuned, tuned)


def test_not_glibc_and_opt_out_change_nothing(monkeypatch):
    monkeypatch.delenv(malloc_tuning.ENV_VAR, raising=False)
    monkeypatch.setattr(malloc_tuning, "glibc_version", lambda: None)
    assert malloc_tuning._apply(malloc_tuning.THRESHOLD) == "off: not glibc"
    monkeypatch.setenv(malloc_tuning.ENV_VAR, "0")
    assert malloc_tuning._apply(malloc_tuning.THRESHOLD) == f"off: {malloc_tuning.ENV_VAR}=0"


def test_outcome_is_decided_once(monkeypatch):
    monkeypatch.setattr(malloc_tuning, "_state", {})
    calls = []
    monkeypatch.setattr(malloc_tuning, "_apply", lambda t: calls.append(t) or "off: test")
    assert malloc_tuning.outcome() is None
    assert malloc_tuning.tune_malloc() == malloc_tuning.tune_malloc() == "off: test"
    assert calls == [malloc_tuning.THRESHOLD] and malloc_tuning.outcome() == "off: test"


@pytest.mark.skipif(malloc_tuning.glibc_version() is None, reason="glibc only")
@pytest.mark.parametrize("bad", [0, 2 ** 31])
def test_threshold_outside_a_c_int_is_refused(monkeypatch, bad):
    monkeypatch.delenv(malloc_tuning.ENV_VAR, raising=False)
    with pytest.raises(ValueError, match="C int"):
        malloc_tuning._apply(bad)


@pytest.mark.skipif(malloc_tuning.glibc_version() is None or shutil.which("cc") is None,
                    reason="glibc and a C compiler")
def test_a_preloaded_allocator_turns_it_off(tmp_path):
    """Under LD_PRELOAD of another malloc (built here: a malloc that forwards to glibc's, as
    tcmalloc or jemalloc would stand in front of it), glibc's mallopt would tune a heap nothing
    uses: the outcome says off, and why."""
    src = tmp_path / "shim.c"
    src.write_text("#define _GNU_SOURCE\n#include <dlfcn.h>\n#include <stddef.h>\n"
                   "static void *(*real)(size_t);\n"
                   "void *malloc(size_t n) { if (!real) real = dlsym(RTLD_NEXT, \"malloc\"); return real(n); }\n")
    lib = tmp_path / "libshim.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(src), "-ldl"], check=True, timeout=120)
    code = "from agentq.utils.malloc_tuning import tune_malloc; print(tune_malloc())"
    run = lambda env: subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                     timeout=120, check=True).stdout.strip()
    preloaded = run({**_env(), "LD_PRELOAD": str(lib)})
    assert preloaded.startswith("off: malloc is not glibc's") and str(lib) in preloaded, preloaded
    assert not run(_env()).startswith("off: malloc is not glibc's")
