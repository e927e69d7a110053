o="$1"
python3 -c "import pytest_rerunfailures; print('rerunfailures ok')"
t gputests 420 python3 -m pytest -q -p no:randomly -p no:cacheprovider tests/rollout/test_engine_cuda.py tests/kernels/test_triton_cuda.py -x
