"""The Prometheus rules in deploy/prometheus: valid (``promtool check rules``), their unit tests pass (``promtool test
rules``), every alert has a test, and every metric they use is one the checker exports.

promtool comes with Debian's ``prometheus`` package (``bash scripts/setup`` installs it). Without it these tests are
skipped on a developer's machine, and fail in CI (``CI=true``), where a missing promtool must not pass silently."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client.metrics_core import Metric

from redis_txmq.checker import CheckerMetrics

RULES_DIR = Path(__file__).resolve().parent.parent / "deploy" / "prometheus"
RULES = RULES_DIR / "txmq-rules.yml"
RULE_TESTS = RULES_DIR / "txmq-rules.test.yml"


def promtool_path() -> str:
    """promtool's path; a skip without it on a developer's machine, a failure in CI."""
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("promtool is missing: bash scripts/setup installs Debian's prometheus package, which has it")
        pytest.skip("promtool is missing (bash scripts/setup installs it)")
    return found


@pytest.fixture(scope="module")
def promtool() -> str:
    return promtool_path()


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=RULES_DIR, capture_output=True, text=True, timeout=120, check=False)


def test_the_rules_are_valid(promtool: str) -> None:
    result = run(promtool, "check", "rules", RULES.name)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_the_rules_pass_their_unit_tests(promtool: str) -> None:
    result = run(promtool, "test", "rules", RULE_TESTS.name)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_unit_test() -> None:
    alerts = set(re.findall(r"^\s*- alert: (\w+)", RULES.read_text(), re.MULTILINE))
    tested = set(re.findall(r"^\s*alertname: (\w+)", RULE_TESTS.read_text(), re.MULTILINE))
    assert alerts and alerts == tested


def exported_names() -> set[str]:
    """The sample names a checker serves (a counter ``x`` as ``x_total``, a histogram's ``_bucket``...)."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
    families: list[Metric] = list(CheckerMetrics().registry.collect())
    return {family.name + suffix for family in families for suffix in suffixes.get(family.type, ("",))}


def test_the_rules_use_only_metrics_the_checker_exports() -> None:
    used = set(re.findall(r"\btxmq_[a-z_]+\b", RULES.read_text()))
    assert "txmq_checker_last_round_timestamp_seconds" in used
    assert used <= exported_names(), used - exported_names()
