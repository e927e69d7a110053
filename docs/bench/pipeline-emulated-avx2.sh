set -e
cd "${1:?a fresh clone of agentq}"
start=$(date +%s)
python3 -m venv .venv && . .venv/bin/activate && pip install -q torch==2.13.0 -e . 2>&1 | grep -v WARNING || true
inst=$(date +%s); echo "install_s=$((inst-start))"
export AGENTQ_CACHE=$(mktemp -d)
python -c "import sys, torch; torch.backends.mkldnn.enabled = False; from agentq.cli import main; sys.exit(main(['pipeline']))"
end=$(date +%s); echo "pipeline_s=$((end-inst)) total_s=$((end-start))"
