# Round 53: asked for the H200 (issue 14's 1B B 64 with round 51's launch table: docs/bench/h100-r51/h200-next.sh);
# an H100 came once, so the call ran the GPU test suite at the round's tree instead (no H200 work runs on an H100).
timeout 420 bash docs/bench/h200-suite.sh tests OUT
#   -> gputests.log (8fa06c3's tree; the device copy's git line reads 0236f64): 348 passed, 176 skipped (every test file with CUDA cases, TRITON_INTERPRET ones included)
