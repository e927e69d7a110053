"""The learner's `grad_input` option (`Learner(grad_input=)`, `align_model(grad_input=)`, the
trainer key `trainer.grad_input`): the aligned linears' dX in backward as the compute dtype's GEMM
("bf16", the default) or per-token int8 gradients ("int8", `ste._int8_grad_input`).

Asserted on the tiny model (fp32, CPU): every aligned linear gets the option, alone and grouped
(q/k/v and gate/up one call each); int8 gradients of every parameter within 6 % (relative
Frobenius) and cosine ≥ 0.998 of the bf16 option's (measured ≤ 2.2 % / ≥ 0.9997: each dX carries
≈1 % and the errors of later layers reach earlier ones); the default is the "bf16" option bit for
bit; bad values are refused before a model is loaded."""
import pytest
import torch
from transformers import AutoModelForCausalLM

from agentq.kernels import ste
from agentq.kernels.quant_spec import QuantSpec
from agentq.learner.learner import Learner
from agentq.learner.qat import QATLinear, align_model

SPEC = QuantSpec.preset("w8a8_kv8")


def _grads(path, grouped: bool | None, **kw):
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    align_model(model, SPEC, group_projections=grouped, **kw)
    ids = torch.randint(3, 200, (3, 40), generator=torch.Generator().manual_seed(0))
    logits = model(input_ids=ids).logits
    torch.log_softmax(logits.float(), -1)[:, :-1].gather(-1, ids[:, 1:, None]).mean().backward()
    return model, {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("grouped", [False, True])
def test_int8_option_reaches_every_linear_and_gradients_stay_close(tiny_model_dir, grouped, monkeypatch):
    calls = []
    real = ste._int8_grad_input
    monkeypatch.setattr(ste, "_int8_grad_input", lambda *a: calls.append(a[1].shape) or real(*a))
    model, int8 = _grads(tiny_model_dir, grouped, grad_input="int8")
    layers = model.config.num_hidden_layers
    assert all(m.grad_input == "int8" for m in model.modules() if isinstance(m, QATLinear))
    assert len(calls) == (4 if grouped else 7) * layers          # one int8 dX per aligned GEMM
    _, ref = _grads(tiny_model_dir, grouped)
    for name, g in ref.items():
        a, b = int8[name].flatten().double(), g.flatten().double()
        assert float(a @ b / (a.norm() * b.norm())) >= 0.998, name
        assert float((a - b).norm() / b.norm()) <= 0.06, name


def test_default_is_the_bf16_option_bit_for_bit(tiny_model_dir):
    _, default = _grads(tiny_model_dir, None)
    _, bf16 = _grads(tiny_model_dir, None, grad_input="bf16")
    assert default.keys() == bf16.keys()
    assert all(torch.equal(default[n], bf16[n]) for n in default)


def test_learner_passes_the_option_and_refuses_bad_values(tiny_model_dir):
    learner = Learner(str(tiny_model_dir), SPEC, use_reference=False, grad_input="int8")
    assert learner.grad_input == "int8"
    assert {m.grad_input for m in learner.model.modules() if isinstance(m, QATLinear)} == {"int8"}
    with pytest.raises(ValueError, match=r"grad_input='int4'; valid: \['bf16', 'int8'\]"):
        Learner("/no/such/model", SPEC, grad_input="int4")       # refused before any loading
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with pytest.raises(ValueError, match="grad_input='INT8'"):
        align_model(model, SPEC, grad_input="INT8")
