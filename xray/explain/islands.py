"""fp32 islands: named submodules that run in float32 inside a reduced-precision model.

``keep_in_fp32`` is what ``xray fix`` measures and, verbatim (its source), the code it prints:
the search and the pasted fix are one path. It imports what it needs itself so its source runs
on its own.
"""


def keep_in_fp32(model, names, device_type="cpu"):
    """Run the submodules ``names`` of ``model`` in float32 and return ``model``.

    Inside each: autocast off, TF32 off (CUDA), weights and floating inputs in float32. Outputs
    stay float32 under autocast (its next op casts as it needs); in a model stored in fp16/bf16
    they are cast back to the island's input dtype, which the next module's weights expect."""
    import torch
    from torch.utils._pytree import tree_leaves, tree_map

    def floats(tree):
        return [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor) and t.is_floating_point()]

    def to(dtype):
        return lambda t: t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t

    def island(module):
        forward = module.forward

        def run_in_fp32(*args, **kwargs):
            given = floats((args, kwargs))
            outer_autocast = torch.is_autocast_enabled(device_type)
            tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
            try:
                with torch.autocast(device_type, enabled=False):
                    out = forward(*tree_map(to(torch.float32), args), **tree_map(to(torch.float32), kwargs))
            finally:
                torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
            if given and not outer_autocast and given[0].dtype != torch.float32:
                out = tree_map(to(given[0].dtype), out)
            return out

        module.float()
        module.forward = run_in_fp32

    for name in names:
        island(model.get_submodule(name))
    return model
