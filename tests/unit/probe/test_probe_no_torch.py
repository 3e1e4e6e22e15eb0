"""The operator image has no torch: the probe package and its CLIs must not import it."""

import subprocess
import sys


def test_probe_and_its_clis_import_without_torch():
    code = (
        "import sys, dsv4_engine.probe, dsv4_engine.probe.html_report, "
        "dsv4_engine.probe.scripted_server, dsv4_operator.cli.probe, dsv4_operator.cli.validate; "
        "heavy = sorted(m for m in ('torch', 'triton', 'scipy', 'numpy') if m in sys.modules); "
        "print(heavy); sys.exit(1 if heavy else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
