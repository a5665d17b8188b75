"""The CPU kernel of sliding-window attention: parity with masked attention for every vectorised head dim, threads,
the custom op's registrations, and what happens where it cannot be built.

The reference is PyTorch's own attention over the full sequence with the dense neighbourhood mask (built by
``neighborhood_attention_mask``, itself checked against explicit loops in ``test_neighborhood_attention.py``).
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import torch.nn.functional as F

from vit.kernels import neighborhood as neighborhood_kernel
from vit.layers import Attention, NeighborhoodAttention, neighborhood_attention_mask


def require_kernel():
    """Skip where no C++ compiler is installed; where one is (CI has g++), a kernel that does not build fails."""
    if neighborhood_kernel.find_compiler() is None:
        pytest.skip("no C++ compiler: the layer uses its tiled path")
    assert neighborhood_kernel.load() is not None, neighborhood_kernel.status()


@pytest.fixture
def kernel():
    require_kernel()
    return neighborhood_kernel


@pytest.fixture
def fresh_kernel_state(monkeypatch):
    """Forget the loaded kernel for one test (restored afterwards)."""
    monkeypatch.setattr(neighborhood_kernel, "_lib", None)
    monkeypatch.setattr(neighborhood_kernel, "_state", "not built")
    return neighborhood_kernel


def neighbours(rows: int, cols: int, k: int, d: int, prefix: int) -> torch.Tensor:
    layer = NeighborhoodAttention(8, 1, grid_size=(rows, cols), kernel_size=k, dilation=d, num_prefix_tokens=prefix)
    return layer.neighbour_index


def reference(q, k, v, rows, cols, ksize, d, prefix):
    mask = neighborhood_attention_mask((rows, cols), ksize, d, prefix)
    out = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), attn_mask=mask)
    return out.transpose(1, 2)


def test_a_compiler_here_builds_the_kernel(kernel):
    """Where a C++ compiler is installed, the layer's CPU default is the kernel, not the fallback."""
    assert kernel.status() == "ready" and kernel.available()


@pytest.mark.parametrize("head_dim", [16, 32, 48, 64, 96, 128, 8, 20])
@pytest.mark.parametrize(
    ("rows", "cols", "ksize", "d", "prefix"), [(9, 11, 5, 1, 1), (10, 13, 3, 2, 5), (7, 7, 7, 1, 0)]
)
def test_op_equals_masked_attention_forward_and_backward(kernel, head_dim, rows, cols, ksize, d, prefix):
    """Head dims 16 ... 128 run the vectorised code, 8 and 20 the plain loop; prefix queries attend to everything."""
    B, H, N = 2, 3, prefix + rows * cols
    q, k, v = (torch.randn(B, N, H, head_dim, requires_grad=True) for _ in range(3))
    scale = head_dim**-0.5
    out, prob, prob_prefix = kernel.neighborhood_attention_cpu(
        q, k, v, neighbours(rows, cols, ksize, d, prefix), prefix, scale
    )
    want = reference(q, k, v, rows, cols, ksize, d, prefix)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    # The kept probabilities are the softmax rows: each sums to 1 over its K (or N) keys.
    assert prob.shape == (B, H, N - prefix, prefix + ksize * ksize) and prob_prefix.shape == (B, H, prefix, N)
    torch.testing.assert_close(prob.sum(-1), torch.ones(B, H, N - prefix))
    assert out.requires_grad and not prob.requires_grad and not prob_prefix.requires_grad  # kept, not differentiable
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)
    expected = torch.autograd.grad(want, (q, k, v), grad)
    for g, w in zip(got, expected, strict=True):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)


def test_threads_split_the_work_without_changing_a_bit(kernel):
    """(image, head) pairs are independent: two threads give bit-identical outputs and gradients to one."""
    B, N, H, D = 3, 1 + 12 * 12, 4, 32
    table = neighbours(12, 12, 5, 1, 1)
    q, k, v = (torch.randn(B, N, H, D, requires_grad=True) for _ in range(3))
    grad = torch.randn(B, N, H, D)
    results = []
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            out = kernel.neighborhood_attention_cpu(q, k, v, table, 1, D**-0.5)[0]
            results.append((out, *torch.autograd.grad(out, (q, k, v), grad)))
    finally:
        torch.set_num_threads(threads)
    assert kernel._pool_key == (os.getpid(), 1)  # two threads: this one and one from the pool
    for one, two in zip(*results, strict=True):
        torch.testing.assert_close(one, two, atol=0, rtol=0)


def test_any_strides_in_any_argument(kernel):
    """Transposed, chunked and expanded inputs (and a transposed table) give the packed inputs' results, backward
    included: the backward reads the tensors saved from the caller, not the forward's packed copies."""
    B, N, H, D, P = 2, 1 + 6 * 7, 2, 16, 1
    table = neighbours(6, 7, 3, 1, P)
    qkv = torch.randn(B, N, 3 * H * D, requires_grad=True)
    q, k, v = (t.unflatten(-1, (H, D)) for t in qkv.chunk(3, dim=-1))  # strided views of one tensor
    grad = torch.randn(B, H, N, D).transpose(1, 2)  # a non-contiguous gradient
    got = kernel.neighborhood_attention_cpu(q, k, v, table.t().contiguous().t(), P, 0.25)[0]
    want = reference(q, k, v, 6, 7, 3, 1, P)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(
        torch.autograd.grad(got, qkv, grad)[0], torch.autograd.grad(want, qkv, grad)[0], atol=1e-5, rtol=1e-4
    )
    k_shared = torch.randn(B, 1, H, D).expand(B, N, H, D)  # stride 0 along the tokens
    torch.testing.assert_close(
        kernel.neighborhood_attention_cpu(q, k_shared, v, table, P, 0.25)[0],
        reference(q, k_shared, v, 6, 7, 3, 1, P),
        atol=1e-5,
        rtol=1e-5,
    )


def test_custom_op_registrations_pass_opcheck(kernel):
    """Schema, fake (meta) function and autograd registration, as torch.compile relies on them."""
    q, k, v = (torch.randn(2, 1 + 6 * 7, 2, 16, requires_grad=True) for _ in range(3))
    torch.library.opcheck(kernel.neighborhood_attention_cpu, (q, k, v, neighbours(6, 7, 3, 1, 1), 1, 0.25))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"k": torch.randn(1, 10, 2, 16).double()}, "k must be a float32 CPU tensor"),
        ({"table": neighbours(3, 4, 3, 1, 1)}, "neighbours has 12 rows for 9 patch queries"),
        ({"table": neighbours(3, 3, 3, 1, 1) + 1}, r"neighbours must index tokens in \[0, 10\), got \[1, 10\]"),
        ({"table": neighbours(3, 3, 3, 1, 1).int()}, "neighbours must be a 2-D int64 CPU tensor"),
        ({"prefix": 11}, r"num_prefix_tokens must be in \[0, 10\]"),
    ],
)
def test_bad_inputs_are_refused_before_the_kernel_reads_them(kernel, change, message):
    q = torch.randn(1, 10, 2, 16)
    args = {"k": q, "table": neighbours(3, 3, 3, 1, 1), "prefix": 1} | change
    with pytest.raises(ValueError, match=message):
        kernel.neighborhood_attention_cpu(q, args["k"], q, args["table"], args["prefix"], 0.25)


def test_the_layer_refuses_a_sequence_of_the_wrong_length(kernel):
    layer = NeighborhoodAttention(32, 2, grid_size=(6, 7), kernel_size=3, num_prefix_tokens=1)
    with pytest.raises(ValueError, match="6x7 grid with 1 prefix tokens expects 43 tokens, got 42"):
        layer(torch.randn(2, 42, 32))


def _paths_taken(layer, x, monkeypatch) -> list[str]:
    taken = []
    for name in ("forward_kernel", "forward_tiled"):
        method = getattr(layer, name)
        monkeypatch.setattr(layer, name, lambda x, m=method, n=name: taken.append(n) or m(x))
    layer(x)
    return taken


def test_which_path_the_layer_takes_on_the_cpu(kernel, monkeypatch):
    """The kernel for fp32 (training and eval, qk_norm too); the tiled path for autocast, attention dropout in
    training, fused_attn=False, other dtypes and torch.func transforms."""
    x = torch.randn(2, 43, 32)

    def layer(**kwargs):
        return NeighborhoodAttention(32, 2, grid_size=(6, 7), kernel_size=3, num_prefix_tokens=1, **kwargs)

    assert _paths_taken(layer().train(), x, monkeypatch) == ["forward_kernel"]
    assert _paths_taken(layer(attn_drop=0.1).eval(), x, monkeypatch) == ["forward_kernel"]
    assert _paths_taken(layer(attn_drop=0.1).train(), x, monkeypatch) == ["forward_tiled"]
    assert _paths_taken(layer(fused_attn=False), x, monkeypatch) == ["forward_tiled"]
    assert _paths_taken(layer().double(), x.double(), monkeypatch) == ["forward_tiled"]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert _paths_taken(layer(), x, monkeypatch) == ["forward_tiled"]
    taken = []
    plain = layer()
    monkeypatch.setattr(plain, "forward_kernel", lambda x: taken.append("kernel") or plain.forward_tiled(x))
    torch.func.grad(lambda x: plain(x).sum())(x)
    assert taken == []


def test_qk_norm_on_the_kernel_path(kernel):
    layer = NeighborhoodAttention(64, 2, grid_size=(6, 7), kernel_size=5, num_prefix_tokens=1, qk_norm=True)
    dense = Attention(64, 2, qk_norm=True)
    dense.load_state_dict(layer.state_dict(), strict=True)
    x = torch.randn(2, 43, 64, requires_grad=True)
    out, want = layer(x), dense(x, attn_mask=layer.dense_mask())
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    grad = torch.randn_like(out)
    for g, w in zip(
        torch.autograd.grad(out, [x, *layer.parameters()], grad),
        torch.autograd.grad(want, [x, *dense.parameters()], grad),
        strict=True,
    ):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)


def test_building_a_layer_compiles_nothing_its_first_cpu_forward_does(fresh_kernel_state, monkeypatch, tmp_path):
    """Built, switched to eval and inspected, the layer leaves the kernel alone (the cache stays empty); its first CPU
    fp32 forward compiles and loads it and runs it, with the masked attention's outputs and gradients."""
    if neighborhood_kernel.find_compiler() is None:
        pytest.skip("no C++ compiler: the layer uses its tiled path")
    monkeypatch.setenv("VIT_CACHE_DIR", str(tmp_path))
    layer = NeighborhoodAttention(32, 2, grid_size=(6, 7), kernel_size=3, num_prefix_tokens=1).eval()
    dense = Attention(32, 2).eval()
    dense.load_state_dict(layer.state_dict(), strict=True)
    mask = layer.dense_mask()
    assert neighborhood_kernel.status() == "not built" and not neighborhood_kernel.available()
    assert not list(tmp_path.rglob("*"))
    x = torch.randn(2, 43, 32, requires_grad=True)
    out = layer(x)
    assert neighborhood_kernel.status() == "ready" and neighborhood_kernel.available()
    assert [p.suffix for p in (tmp_path / "kernels").iterdir()] == [".so"]
    want = dense(x, attn_mask=mask)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    grad = torch.randn_like(out)
    torch.testing.assert_close(
        torch.autograd.grad(out, x, grad)[0], torch.autograd.grad(want, x, grad)[0], atol=1e-5, rtol=1e-4
    )


def test_first_forwards_in_two_threads_build_the_kernel_once(fresh_kernel_state, monkeypatch):
    """Two threads' first forwards at once: one build, and both run the kernel."""
    if neighborhood_kernel.find_compiler() is None:
        pytest.skip("no C++ compiler: the layer uses its tiled path")
    builds, build = [], neighborhood_kernel.build
    monkeypatch.setattr(neighborhood_kernel, "build", lambda: builds.append(1) or build())
    layer = NeighborhoodAttention(32, 2, grid_size=(6, 7), kernel_size=3, num_prefix_tokens=1).eval()
    taken = []
    monkeypatch.setattr(layer, "forward_kernel", lambda x, m=layer.forward_kernel: taken.append(1) or m(x))
    x = torch.randn(2, 43, 32)
    with ThreadPoolExecutor(2) as pool:
        outs = list(pool.map(layer, [x, x]))
    assert builds == [1] and taken == [1, 1] and neighborhood_kernel.status() == "ready"
    torch.testing.assert_close(outs[0], outs[1], atol=0, rtol=0)


def test_forwards_that_do_not_run_the_kernel_do_not_load_it(fresh_kernel_state):
    """fp64, fused_attn=False, autocast, attention dropout in training and torch.func transforms take the tiled path
    without building the kernel."""
    x = torch.randn(2, 43, 32)

    def layer(**kwargs):
        return NeighborhoodAttention(32, 2, grid_size=(6, 7), kernel_size=3, num_prefix_tokens=1, **kwargs)

    layer().double()(x.double())
    layer(fused_attn=False)(x)
    layer(attn_drop=0.1).train()(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        layer()(x)
    plain = layer()
    torch.func.grad(lambda x: plain(x).sum())(x)
    assert neighborhood_kernel.status() == "not built" and not neighborhood_kernel.available()


def test_a_model_compiled_before_it_ever_ran_traces_the_kernel(fresh_kernel_state, monkeypatch):
    """The first (compiled) call loads the kernel while tracing (:func:`ready` is a constant to dynamo), so the op is
    in its graph."""
    if neighborhood_kernel.find_compiler() is None:
        pytest.skip("no C++ compiler")
    torch._dynamo.reset()
    layer = NeighborhoodAttention(32, 2, grid_size=(6, 7), kernel_size=3, num_prefix_tokens=1)
    assert neighborhood_kernel.status() == "not built"
    targets = []

    def record(gm, example_inputs):
        targets.extend(str(node.target) for node in gm.graph.nodes)
        return gm.forward

    torch.compile(layer, backend=record, fullgraph=True)(torch.randn(2, 43, 32))
    assert "vit.neighborhood_attention_cpu.default" in targets


def test_build_is_cached(kernel, tmp_path, monkeypatch):
    monkeypatch.setenv("VIT_CACHE_DIR", str(tmp_path))
    path = kernel.build()
    assert path.parent == tmp_path / "kernels" and path.suffix == ".so"
    built = path.stat().st_mtime_ns
    assert kernel.build() == path and path.stat().st_mtime_ns == built  # found, not compiled again
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left behind


def test_without_a_compiler_the_layer_falls_back_to_the_tiled_path(fresh_kernel_state, monkeypatch, caplog, tmp_path):
    monkeypatch.setenv("VIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    x = torch.randn(2, 43, 32)
    with caplog.at_level(logging.WARNING, logger=neighborhood_kernel.__name__):
        layer = NeighborhoodAttention(32, 2, grid_size=(6, 7), kernel_size=3, num_prefix_tokens=1).eval()
        NeighborhoodAttention(32, 2, grid_size=(6, 7), kernel_size=3, num_prefix_tokens=1)
        out = layer(x)
        layer(x)
    dense = Attention(32, 2).eval()
    dense.load_state_dict(layer.state_dict())
    assert not neighborhood_kernel.available()
    assert "does not run" in neighborhood_kernel.status()
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and "using the tiled path" in messages[0]  # said once, not per call
    torch.testing.assert_close(out, dense(x, attn_mask=layer.dense_mask()), atol=1e-5, rtol=1e-5)
    assert not list(tmp_path.glob("kernels/*"))


def test_a_compiler_that_fails_is_reported_with_its_output(fresh_kernel_state, monkeypatch, tmp_path):
    fake = tmp_path / "cc"
    fake.write_text("#!/bin/sh\n[ \"$1\" = --version ] && exit 0\necho 'fatal: out of luck' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("VIT_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(RuntimeError, match="could not compile(.|\n)*out of luck"):
        neighborhood_kernel.build([str(fake)])
    assert not list((tmp_path / "cache").rglob("*"))  # nothing half-written, not even the cache's folder


def test_switched_off_by_the_environment(fresh_kernel_state, monkeypatch):
    monkeypatch.setenv(neighborhood_kernel.ENV_SWITCH, "0")
    assert neighborhood_kernel.load() is None
    assert neighborhood_kernel.status() == f"switched off ({neighborhood_kernel.ENV_SWITCH}=0)"


@pytest.mark.skipif(os.name != "posix", reason="the kernel is built with a POSIX C++ compiler")
def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("VIT_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert neighborhood_kernel.cache_dir() == tmp_path / "vit" / "kernels"
    monkeypatch.setenv("VIT_CACHE_DIR", str(tmp_path / "mine"))
    assert neighborhood_kernel.cache_dir() == tmp_path / "mine" / "kernels"


def test_a_library_of_another_interface_version_is_refused(kernel, fresh_kernel_state, monkeypatch):
    """The source's ``vit_na_abi_version()`` is read at load: a library built for another interface is never called."""
    monkeypatch.setattr(neighborhood_kernel, "ABI_VERSION", 2)
    assert neighborhood_kernel.load() is None
    assert "has C interface version 1, this module calls version 2" in neighborhood_kernel.status()
