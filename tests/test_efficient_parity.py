"""Numerical parity with the public TensorFlow code of Efficient-CapsNet (EscVM/
Efficient-CapsNet; TensorFlow is not installed here). Their layer functions are transcribed
to numpy line by line below, each line citing the file and line it transcribes (utils/
layers.py at commit 705449c, models/efficient_capsnet_graph_mnist.py at 61fceb4, utils/
tools.py at 528612d), and run on the same weights and inputs as capsnet's model.

Keras' defaults the transcription makes explicit: Conv2D is NHWC with kernels (Kh, Kw, C_in,
C_out); BatchNormalization at inference is gamma (x - mean) / sqrt(var + 1e-3) + beta;
Dense is x @ K + b with K (in, out); the loss 'mse' is the mean over every pixel.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from numpy.lib.stride_tricks import sliding_window_view

from capsnet.losses import capsule_loss
from capsnet.models import EfficientCapsNet, ModelOutput, make_config
from capsnet.models.efficient_capsnet import BN_EPS

EPS = 10e-21  # utils/layers.py:72, Squash.__init__(self, eps=10e-21)
KERAS_EPSILON = 1e-7  # tf.keras.backend.epsilon(), used by Length (utils/layers.py:218)
KERAS_BN_EPSILON = 1e-3  # BatchNormalization(epsilon=0.001), Keras' default
LMD_GEN = 0.392  # config.json "lmd_gen": the weight of the reconstruction 'mse'


# --- utils/layers.py, transcribed ------------------------------------------------------------

def tf_squash(s, eps=EPS):
    """utils/layers.py:76-78, class Squash, method call."""
    n = np.linalg.norm(s, axis=-1, keepdims=True)  # :77 n = tf.norm(s,axis=-1,keepdims=True)
    return (1 - 1 / (np.exp(n) + eps)) * (s / (n + eps))  # :78


def tf_depthwise_conv(x, kernel, bias):
    """Keras Conv2D(F, K, 1, groups=F, padding='valid') as built at utils/layers.py:123-124:
    x (B, H, W, F), kernel (K, K, 1, F), bias (F,)."""
    K = kernel.shape[0]
    windows = sliding_window_view(x, (K, K), axis=(1, 2))  # (B, H', W', F, K, K)
    return np.einsum("byxfij,ijf->byxf", windows, kernel[:, :, 0, :]) + bias


def tf_primary_caps(x, kernel, bias, N, D):
    """utils/layers.py:128-133, class PrimaryCaps, method call."""
    x = tf_depthwise_conv(x, kernel, bias)  # :129 x = self.DW_Conv2D(inputs)
    x = x.reshape(x.shape[0], N, D)  # :130 x = tf.keras.layers.Reshape((self.N, self.D))(x)
    x = tf_squash(x)  # :131 x = Squash()(x)
    return x  # :133


def tf_softmax(x, axis):
    """tf.nn.softmax."""
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def tf_fccaps(inputs, W, b, D):
    """utils/layers.py:172-183, class FCCaps, method call. W (N, input_N, input_D, D) and
    b (N, input_N, 1) as built at :168-169."""
    u = np.einsum("...ji,kjiz->...kjz", inputs, W)  # :174 u shape=(None,N,H*W*input_N,D)
    c = np.einsum("...ij,...kj->...i", u, u)[..., None]  # :176
    c = c / np.sqrt(np.asarray(D, dtype=u.dtype))  # :177 c = c/tf.sqrt(tf.cast(self.D, ...))
    c = tf_softmax(c, axis=1)  # :178 c = tf.nn.softmax(c, axis=1)
    c = c + b  # :179 c = c + self.b
    s = np.sum(np.multiply(u, c), axis=-2)  # :180 s = tf.reduce_sum(tf.multiply(u, c),axis=-2)
    v = tf_squash(s)  # :181 v = Squash()(s)
    return v  # :183


def tf_length(inputs):
    """utils/layers.py:218, class Length, method call."""
    return np.sqrt(np.sum(np.square(inputs), -1) + KERAS_EPSILON)


def tf_mask(inputs, mask):
    """utils/layers.py, class Mask, method call, single mask: inputs (B, N, D), mask (B, N)
    one-hot -> batch_flatten(inputs * expand_dims(mask, -1))."""
    return (inputs * mask[..., None]).reshape(inputs.shape[0], -1)


# --- models/efficient_capsnet_graph_mnist.py, transcribed -------------------------------------

def keras_conv_relu(x, kernel, bias, stride):
    """Conv2D(F, K, stride, activation='relu', padding='valid'): x (B, H, W, C), kernel
    (K, K, C, F)."""
    K = kernel.shape[0]
    windows = sliding_window_view(x, (K, K), axis=(1, 2))[:, ::stride, ::stride]
    return np.maximum(np.einsum("byxcij,ijcf->byxf", windows, kernel) + bias, 0)


def keras_batch_norm(x, gamma, beta, mean, var):
    """BatchNormalization() at inference."""
    return gamma * (x - mean) / np.sqrt(var + KERAS_BN_EPSILON) + beta


def tf_efficient_capsnet(x, p):
    """models/efficient_capsnet_graph_mnist.py:30-46, efficient_capsnet_graph (inference),
    on NHWC images x (B, 28, 28, 1) and the Keras-layout weights ``p``."""
    for i, stride in enumerate((1, 1, 1, 2)):  # :32-39 Conv2D(32,5) ... Conv2D(128,3,2), each
        x = keras_conv_relu(x, p[f"conv{i}"], p[f"conv{i}_bias"], stride)  # with relu, then
        x = keras_batch_norm(x, *p[f"bn{i}"])  # BatchNormalization()
    x = tf_primary_caps(x, p["dw"], p["dw_bias"], 16, 8)  # :40 PrimaryCaps(128, 9, 16, 8)(x)
    digit_caps = tf_fccaps(x, p["W"], p["b"], 16)  # :42 FCCaps(10,16)(x)
    digit_caps_len = tf_length(digit_caps)  # :44 Length(...)(digit_caps)
    return digit_caps, digit_caps_len


def tf_generator(masked, p):
    """models/efficient_capsnet_graph_mnist.py, generator_graph: Dense 512 relu, Dense 1024
    relu, Dense 784 sigmoid, Reshape to the image."""
    x = np.maximum(masked @ p["dense0"] + p["dense0_bias"], 0)
    x = np.maximum(x @ p["dense1"] + p["dense1_bias"], 0)
    x = 1 / (1 + np.exp(-(x @ p["dense2"] + p["dense2_bias"])))
    return x.reshape(masked.shape[0], 28, 28, 1)


def keras_weights(model: EfficientCapsNet) -> dict:
    """capsnet's weights in the public code's (Keras) layouts, as numpy arrays."""
    def a(t):
        return t.detach().cpu().numpy()

    p = {}
    for i, block in enumerate(model.features):
        p[f"conv{i}"] = a(block.conv.weight.permute(2, 3, 1, 0))  # (O, C, K, K) -> (K, K, C, O)
        p[f"conv{i}_bias"] = a(block.conv.bias)
        norm = block.norm
        p[f"bn{i}"] = tuple(a(t) for t in (norm.weight, norm.bias, norm.running_mean,
                                           norm.running_var))
    p["dw"] = a(model.primary_caps.conv.weight.permute(2, 3, 1, 0))  # (F, 1, K, K) -> (K, K, 1, F)
    p["dw_bias"] = a(model.primary_caps.conv.bias)
    p["W"] = a(model.class_caps.W.permute(1, 0, 2, 3))  # (I, J, 8, 16) -> (J, I, 8, 16)
    p["b"] = a(model.class_caps.router.b)[..., None]  # (J, I) -> (J, I, 1)
    linears = [m for m in model.decoder.modules() if isinstance(m, torch.nn.Linear)]
    for i, linear in enumerate(linears):
        p[f"dense{i}"], p[f"dense{i}_bias"] = a(linear.weight.T), a(linear.bias)
    return p


def tf_margin_loss(y_true, y_pred):
    """utils/tools.py:40-48, marginLoss."""
    lbd = 0.5  # :41
    m_plus = 0.9  # :42
    m_minus = 0.1  # :43
    L = y_true * np.square(np.maximum(0., m_plus - y_pred)) + \
        lbd * (1 - y_true) * np.square(np.maximum(0., y_pred - m_minus))  # :45-46
    return np.mean(np.sum(L, axis=1))  # :48


def keras_mse(y_true, y_pred):
    """Keras' 'mse' loss of models/model.py's compile: the mean squared error over the last
    axis, then averaged over everything else (batch and pixels)."""
    return np.mean(np.mean(np.square(y_pred - y_true), axis=-1))


# --- the comparisons ------------------------------------------------------------------------

def randomised_model(dtype: torch.dtype) -> EfficientCapsNet:
    """The paper's model with every weight, BatchNorm statistic and log prior made nonzero
    and away from its initial value, in eval mode."""
    torch.manual_seed(0)
    model = EfficientCapsNet(make_config("efficient")).to(dtype).eval()
    with torch.no_grad():
        for block in model.features:
            block.norm.weight.uniform_(0.5, 1.5)
            block.norm.bias.normal_(0, 0.1)
            block.norm.running_mean.uniform_(0, 0.5)
            block.norm.running_var.uniform_(0.5, 2)
            block.conv.bias.normal_(0, 0.05)
        model.primary_caps.conv.bias.normal_(0, 0.05)
        model.class_caps.W.mul_(4)  # class capsules of lengths ~0.3-0.9, not ~0.02
        model.class_caps.router.b.normal_(0, 0.2)
    return model


def images(batch: int = 3) -> torch.Tensor:
    return torch.rand(batch, 1, 28, 28, generator=torch.Generator().manual_seed(1))


def to_nhwc(x: torch.Tensor) -> np.ndarray:
    return x.permute(0, 2, 3, 1).numpy()


@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_layer_by_layer_parity_with_the_public_code(dtype, tolerance):
    """Primary capsules, class capsules (self-attention routing) and lengths from the
    transcribed public code, on capsnet's weights, in float64 and float32."""
    model = randomised_model(dtype)
    x = images().to(dtype)
    p = keras_weights(model)
    with torch.no_grad():
        h = model.features(x)  # (B, 128, 9, 9)
        u = model.primary_caps(h)  # (B, 16, 8)
        routed = model.class_caps(u)
        out = model(x)
    theirs_u = tf_primary_caps(to_nhwc(h), p["dw"], p["dw_bias"], 16, 8)
    theirs_v = tf_fccaps(u.numpy(), p["W"], p["b"], 16)
    np.testing.assert_allclose(u.numpy(), theirs_u, atol=tolerance, rtol=0)
    np.testing.assert_allclose(routed.poses.numpy(), theirs_v, atol=tolerance, rtol=0)
    theirs_v_all, theirs_len = tf_efficient_capsnet(to_nhwc(x), p)
    np.testing.assert_allclose(out.poses.numpy(), theirs_v_all, atol=tolerance, rtol=0)
    # Their Length adds Keras' epsilon 1e-7 under the root; capsnet's lengths are |v|.
    np.testing.assert_allclose(out.scores.numpy() ** 2 + KERAS_EPSILON, theirs_len ** 2,
                               atol=tolerance, rtol=0)
    bound = KERAS_EPSILON / (2 * out.scores.numpy().min())  # d sqrt(l^2 + e) ~ e / 2l
    assert np.abs(out.scores.numpy() - theirs_len).max() < bound + tolerance


def test_whole_model_parity_with_reconstructions_and_loss():
    """The whole graph in float64: class capsules, the decoder fed the capsules masked by
    the label, and the training loss: marginLoss + 0.392 * Keras 'mse' (a per-pixel mean)
    equals capsnet's margin loss + 0.0005 * the per-image sum of squared errors."""
    model = randomised_model(torch.float64)
    x, y = images(4).double(), torch.tensor([3, 1, 4, 1])
    p = keras_weights(model)
    with torch.no_grad():
        out: ModelOutput = model(x, y)
        loss = capsule_loss(out, x, y, reconstruction_weight=0.0005)
    onehot = np.eye(10)[y.numpy()]
    digit_caps, lengths = tf_efficient_capsnet(to_nhwc(x), p)
    generated = tf_generator(tf_mask(digit_caps, onehot), p)  # (B, 28, 28, 1)
    np.testing.assert_allclose(to_nhwc(out.reconstructions), generated, atol=1e-12, rtol=0)
    theirs = tf_margin_loss(onehot, lengths) + LMD_GEN * keras_mse(to_nhwc(x), generated)
    # 0.392 = 0.0005 * 784; the only difference left is Length's epsilon inside the margin loss
    assert LMD_GEN == pytest.approx(0.0005 * 28 * 28)
    assert abs(loss.item() - theirs) < 1e-6


def test_batchnorm_constants_are_keras():
    assert BN_EPS == KERAS_BN_EPSILON
    model = EfficientCapsNet(make_config("efficient"))
    assert all(block.norm.momentum == pytest.approx(1 - 0.99)  # Keras momentum 0.99
               for block in model.features)


def report_max_differences() -> dict[str, float]:
    """The largest differences from the transcribed public code, float32 and float64 (for
    docs/models-efficient.md): python -c 'from tests.test_efficient_parity import *; ...'."""
    result = {}
    for dtype in (torch.float32, torch.float64):
        model = randomised_model(dtype)
        x = images(8).to(dtype)
        with torch.no_grad():
            out = model(x)
        digit_caps, lengths = tf_efficient_capsnet(to_nhwc(x), keras_weights(model))
        name = str(dtype).removeprefix("torch.")
        result[f"poses {name}"] = float(np.abs(out.poses.numpy() - digit_caps).max())
        result[f"lengths {name}"] = float(np.abs(out.scores.numpy() - lengths).max())
    return result
