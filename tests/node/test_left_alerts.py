"""A member that left on purpose fires no alert; a dead one does (promtool's rule tests)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.node.test_metrics import RULES, _tool

pytestmark = pytest.mark.timeout(120)


def test_a_left_member_fires_no_peer_alert_and_a_dead_one_does(tmp_path: Path) -> None:
    promtool = _tool("promtool")
    rules = tmp_path / "shoal-rules.yml"
    shutil.copy(RULES, rules)
    series = [
        # a sees b left: every scrape shows one left member, no dead one
        {"series": 'shoal_members{job="shoal",instance="a:8770",state="left"}', "values": "1x5"},
        {"series": 'shoal_members{job="shoal",instance="a:8770",state="dead"}', "values": "0x5"},
        # c sees d dead
        {"series": 'shoal_members{job="shoal",instance="c:8770",state="left"}', "values": "0x5"},
        {"series": 'shoal_members{job="shoal",instance="c:8770",state="dead"}', "values": "1x5"},
    ]
    dead_alert = {
        "exp_labels": {"severity": "warning", "instance": "c:8770"},
        "exp_annotations": {
            "summary": "c:8770 sees 1 dead member(s)",
            "description": "Run shoal peers on that node to see which; a dead member lost its "
            "GPUs' work.",
        },
    }
    tests = {
        "rule_files": [rules.name],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    {"eval_time": "3m", "alertname": "ShoalPeerDead", "exp_alerts": [dead_alert]}
                ],
            }
        ],
    }
    test_file = tmp_path / "tests.yml"
    test_file.write_text(json.dumps(tests))  # JSON is YAML
    result = subprocess.run(
        [promtool, "test", "rules", str(test_file)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
