"""Re-introduce a fixed defect and see whether the model-based tests find it, and how fast.

Each ``NN-name.patch`` here reverts one fix (``git apply`` reads the diff after its header); the header says what
the defect is, which commit fixed it and which model should find it. For each patch named, this script makes a
temporary worktree of the repository's ``HEAD`` in the system's temporary directory (never the checkout itself: the
patch is applied there only), copies the checkout's model test files into it (so uncommitted changes to the models
are what is measured), applies the patch, runs that model's test file with pytest at the asked setting, and reports
found / not found, the time, the failing test, the size of the failing example (steps) and its assertion; then
removes the worktree. The whole pytest output of each run is kept in ``<tmp>/txmq-model-defects/``.

    .venv/bin/python tests/model_defects/run.py                  # every patch, CI's setting, pinned and search
    .venv/bin/python tests/model_defects/run.py 04 11 --examples 400 --search-only
    .venv/bin/python tests/model_defects/run.py --none --examples 400   # the models on a correct tree
    .venv/bin/python tests/model_defects/run.py --list

``--search-only`` leaves out the pinned programs (the known defect shapes): what the random search finds by itself;
``--pinned-only`` runs only them. ``--examples`` sets ``TXMQ_MODEL_EXAMPLES`` (both models stay seeded);
``--no-shrink`` sets ``TXMQ_MODEL_SHRINK=0``: the time is then the search's until it found the failure, and the
example is reported as found (shrinking a long one can take minutes). One run at a time, ``nice``d: the machine is
shared, so times vary from run to run.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
MODELS = ("tests/test_protocol_model.py", "tests/test_job_model.py")
PINNED = "pinned"
"""Part of the name of every test that runs a pinned program (``-k``)."""
STEP = re.compile(r"^[E|\s]*(?:\w+ = )?state\.(\w+)\(")
ERROR = re.compile(r"^E\s+[\w.]*(Error|Exception|Exit)\b")
LOGS = Path(tempfile.gettempdir()) / "txmq-model-defects"


def patches() -> list[Path]:
    return sorted(HERE.glob("*.patch"))


def header(patch: Path) -> dict[str, str]:
    """The ``Key: value`` lines before the diff."""
    fields: dict[str, str] = {}
    for line in patch.read_text().splitlines():
        if line.startswith("diff --git"):
            break
        key, sep, value = line.partition(": ")
        if sep and key[:1].isupper() and " " not in key:
            fields[key] = value.strip()
    return fields


def invariant_names() -> set[str]:
    """Methods hypothesis calls after every step (not steps themselves), read from the model files."""
    names = {"teardown"}
    for model in MODELS:
        names |= set(re.findall(r"@invariant\(\)\n\s*def (\w+)", (ROOT / model).read_text()))
    return names


def count_steps(out: str) -> int:
    """The steps of the smallest failing example printed (hypothesis prints one per distinct failure, each up to its
    teardown), invariants not counted; 0 when none is printed."""
    invariants, counts, steps = invariant_names(), [], 0
    for line in out.splitlines():
        match = STEP.match(line)
        if match and match.group(1) == "teardown":
            counts.append(steps)
            steps = 0
        elif match and match.group(1) not in invariants:
            steps += 1
    return min((count for count in counts if count), default=0)


def run_one(
    patch: Path | None,
    examples: str | None,
    select: str | None,
    model: str | None,
    shrink: bool = True,
    keep_going: bool = False,
) -> dict[str, str]:
    """Apply ``patch`` in a fresh worktree and run its model; the outcome."""
    fields = header(patch) if patch else {}
    files = [model] if model else ([fields["Model"]] if "Model" in fields else list(MODELS))
    workdir = Path(tempfile.mkdtemp(prefix="txmq-defect-"))
    tree = workdir / "tree"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(tree), "HEAD"], check=True)
    try:
        for name in (*MODELS, "tests/model_programs.py"):
            shutil.copy2(ROOT / name, tree / name)
        if patch is not None:
            subprocess.run(["git", "-C", str(tree), "apply", str(patch)], check=True)
        env = dict(os.environ, PYTHONPATH=str(tree), TXMQ_REQUIRE_SPARK="1")
        env.pop("TXMQ_MODEL_RANDOM", None)
        env.pop("TXMQ_MODEL_EXAMPLES", None)
        env["TXMQ_MODEL_SHRINK"] = "1" if shrink else "0"
        if examples:
            env["TXMQ_MODEL_EXAMPLES"] = examples
        command = ["nice", "-n", "10", sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        command += [] if keep_going else ["-x"]
        command += ["--show-capture=no", "-o", "addopts=", *files]
        if select:
            command += ["-k", select]
        started = time.monotonic()
        done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
        seconds = time.monotonic() - started
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)
        shutil.rmtree(workdir, ignore_errors=True)
    out = done.stdout + done.stderr
    LOGS.mkdir(exist_ok=True)
    name = f"{patch.stem if patch else 'none'}-{examples or 'ci'}-{select or 'all'}{'' if shrink else '-noshrink'}"
    log = LOGS / f"{name}.log".replace(" ", "_")
    log.write_text(out)
    failures = re.findall(r"^FAILED (\S+)", out, re.M)
    failed = failures[0] if failures else None
    skipped = re.search(r"\d+ skipped", out) and not re.search(r"\d+ (passed|failed)", out)
    steps = count_steps(out)
    return {
        "found": "skipped" if skipped else ("FOUND" if failed else ("not found" if done.returncode == 0 else "error")),
        "seconds": f"{seconds:.0f}",
        "test": ", ".join(failure.split("::", 1)[-1] for failure in failures),
        "steps": str(steps) if failed and steps else "",
        "distinct": (distinct.group(1) if (distinct := re.search(r"found (\d+) distinct failures", out)) else ""),
        "why": next((line[1:].strip() for line in out.splitlines() if ERROR.match(line)), "")[:160],
        "log": str(log),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("defects", nargs="*", help="patch numbers or names (default: all)")
    parser.add_argument("--examples", help="TXMQ_MODEL_EXAMPLES (default: CI's)")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--search-only", action="store_true", help="leave out the pinned programs")
    group.add_argument("--pinned-only", action="store_true", help="run only the pinned programs")
    parser.add_argument("--no-shrink", action="store_true", help="report a failure unshrunk (TXMQ_MODEL_SHRINK=0)")
    parser.add_argument("--keep-going", action="store_true", help="run every test (no -x): every failing one")
    parser.add_argument("--model", help="run this test file instead of the one the patch names")
    parser.add_argument("--none", action="store_true", help="no patch: the models on a correct tree")
    parser.add_argument("--list", action="store_true", help="list the patches and what each re-introduces")
    args = parser.parse_args()
    chosen = [p for p in patches() if not args.defects or any(p.name.startswith(d) for d in args.defects)]
    if args.list:
        for patch in chosen:
            fields = header(patch)
            print(f"{patch.stem}: {fields.get('Defect', '')} [{fields.get('Model', '')}; {fields.get('Fixed', '')}]")
        return 0
    select = f"not {PINNED}" if args.search_only else (PINNED if args.pinned_only else None)
    setting = f"TXMQ_MODEL_EXAMPLES={args.examples}" if args.examples else "CI's setting"
    what = ", search only" if args.search_only else ", pinned only" if args.pinned_only else ""
    print(f"# {setting}{what}{', not shrunk' if args.no_shrink else ''}")
    for patch in [None] if args.none else chosen:
        result = run_one(patch, args.examples, select, args.model, not args.no_shrink, args.keep_going)
        line = f"{patch.stem if patch else '(no patch)'}: {result['found']} in {result['seconds']} s"
        if result["test"]:
            line += f" by {result['test']}" + (f", {result['steps']} steps" if result["steps"] else "")
            line += f" ({result['distinct']} distinct failures)" if result["distinct"] else ""
            line += f": {result['why']}"
        print(f"{line} [{result['log']}]", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
