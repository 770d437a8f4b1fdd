"""A model run all in float16 against float32. A training step's gradients fall below float16's
smallest normal (a tiny model's loss, a mean of squares, gives gradients of 1e-6 to 1e-5), where
rounding is absolute (gradual underflow), and models that clamp float16 values run a clamp's
backward the float32 run never runs. A forward through a layer scale of 1e-6 (ConvNeXt's) makes
activations of 5e-8, subnormals of a bit or two. All are the run's precision, never a bug; the
sweep's first run of float16 training steps had FAIL rows on 45 of 113 architectures."""
from __future__ import annotations

import pytest

from conftest import sweep_noise_run

MODELS = [
    "ernie4_5",  # rotary embedding in float32: gradients of 1e-6 cast to float16 keep two or three bits
    "whisper",  # encoder clamps float16 activations: where(lo <= x <= hi, grad, 0) passes every gradient on
]


@pytest.mark.parametrize("model_type", MODELS)
def test_a_float16_training_step_against_float32_fails_nothing(tmp_path, model_type):
    o = sweep_noise_run(model_type, tmp_path, noise="fp16", backward=True)
    assert o.summary["failed"] == 0, o.summary["first_divergence"]


@pytest.mark.slow  # every call recorded: about 20 s each
@pytest.mark.parametrize("model_type", MODELS)
def test_a_float16_training_step_with_every_call_recorded_fails_nothing(tmp_path, model_type):
    o = sweep_noise_run(model_type, tmp_path, noise="fp16", backward=True, defaults=False)
    assert o.summary["failed"] == 0, o.summary["first_divergence"]


def test_a_float16_forward_through_a_layer_scale_below_the_smallest_normal_fails_nothing(tmp_path):
    """DINOv3's ConvNeXt scales each block's output by gamma = 1e-6: 1.013e-6 in float16, and
    products of 5e-8 that float16 holds as 0 or one subnormal step (the sweep's first run: a FAIL
    row per stage, "parameter gamma differs")."""
    o = sweep_noise_run("dinov3_convnext", tmp_path, noise="fp16", backward=False)
    assert o.summary["failed"] == 0, o.summary["first_divergence"]
