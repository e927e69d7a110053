# Round 43 (one H100 each time; the H200 was asked for six times and not lent): every CUDA test file.
# gputests-b.log: call B at 571bad2's tree (the device copy's git line reads d4fe0ed), the suite's old
# hand-kept list of 25 files:
bash docs/bench/h200-suite.sh tests "$OUT"
# gputests.log: call C at d31fd51's tree, the suite finding every test file with CUDA cases by their
# torch.cuda.is_available() skips (27 files: + tests/utils/test_device.py, tests/kernels/test_quant_dequantize_out.py):
bash docs/bench/h200-suite.sh tests "$OUT"
