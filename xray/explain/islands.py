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
            # torch >= 2.9: the fp32_precision API (it refuses legacy reads once a program mixed them)
            new_api = hasattr(torch.backends, "fp32_precision")
            flags = [(torch.backends.cuda.matmul, "fp32_precision" if new_api else "allow_tf32"),
                     (torch.backends.cudnn.conv if new_api else torch.backends.cudnn,
                      "fp32_precision" if new_api else "allow_tf32")]
            saved = [getattr(obj, name) for obj, name in flags]
            for obj, name in flags:
                setattr(obj, name, "ieee" if new_api else False)
            try:
                with torch.autocast(device_type, enabled=False):
                    out = forward(*tree_map(to(torch.float32), args), **tree_map(to(torch.float32), kwargs))
            finally:
                for (obj, name), value in zip(flags, saved):
                    setattr(obj, name, value)
            if given and not outer_autocast and given[0].dtype != torch.float32:
                out = tree_map(to(given[0].dtype), out)
            return out

        module.float()
        module.forward = run_in_fp32

    for name in names:
        island(model.get_submodule(name))
    return model


def keep_ops_in_fp32(model, ops_by_module, device_type="cpu"):
    """Run the ATen ops named per submodule (``{"layers.0.mlp": ["aten.mm.default"]}``) in
    float32 and return ``model``: their floating inputs are upcast; their outputs stay float32
    under autocast and are cast back to the inputs' dtype otherwise. Everything else in those
    modules keeps the model's precision."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves, tree_map

    def to(dtype):
        return lambda t: t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t

    class Fp32Ops(TorchDispatchMode):
        def __init__(self, ops, autocast):
            super().__init__()
            self.ops, self.autocast = set(ops), autocast  # (autocast reads as off below its dispatch key)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if str(func) not in self.ops:
                return func(*args, **kwargs)
            low = [t.dtype for t in tree_leaves((args, kwargs))
                   if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float32]
            out = func(*tree_map(to(torch.float32), args), **tree_map(to(torch.float32), kwargs))
            if low and not self.autocast:
                out = tree_map(to(low[0]), out)
            return out

    def island(module, ops):
        forward = module.forward

        def run_ops_in_fp32(*args, **kwargs):
            with Fp32Ops(ops, torch.is_autocast_enabled(device_type)):
                return forward(*args, **kwargs)

        module.forward = run_ops_in_fp32

    for name, ops in ops_by_module.items():
        island(model.get_submodule(name), ops)
    return model
