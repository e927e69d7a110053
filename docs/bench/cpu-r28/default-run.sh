cd "$(mktemp -d)" && git clone -q "$OLDPWD" . # a fresh clone of the repository this runs from
export AGENTQ_CACHE=$(mktemp -d)
lscpu | grep -i "model name\|flags" | cut -c1-200
date
start=$(date +%s)
python3 -m venv .venv && . .venv/bin/activate && pip install -q torch==2.13.0 -e . && inst=$(date +%s) && echo "install $((inst-start)) s" && agentq pipeline
echo "exit $?"
end=$(date +%s)
echo "pipeline $((end-inst)) s, total $((end-start)) s"
date
