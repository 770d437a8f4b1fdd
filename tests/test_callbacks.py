"""PrecisionDebugger inside real training loops: a transformers Trainer and a Lightning Trainer,
a few steps each, with the step and rank selection taken from the framework's state."""
from __future__ import annotations

import importlib.util

import pytest
import torch

from xray import load_dump

HF = importlib.util.find_spec("transformers") is not None and importlib.util.find_spec("accelerate") is not None
LIGHTNING = importlib.util.find_spec("lightning") is not None or importlib.util.find_spec("pytorch_lightning") is not None


class TokenData(torch.utils.data.Dataset):
    """Causal-LM batches of 512 tokens."""

    def __init__(self, n: int, vocab: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, 512), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=1000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=1,
                      num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=512,
                      attn_implementation="sdpa", use_cache=False)
    return LlamaForCausalLM(cfg)


def _hf_train(tmp_path, callback, steps: int = 3):
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path / "run"), max_steps=steps, per_device_train_batch_size=1,
                             learning_rate=1e-3, report_to=[], save_strategy="no", logging_strategy="no",
                             use_cpu=True, disable_tqdm=True, dataloader_num_workers=0)
    trainer = Trainer(model=_llama(), args=args, train_dataset=TokenData(steps, 1000), callbacks=[callback])
    trainer.train()
    return trainer


@pytest.mark.slow
@pytest.mark.skipif(not HF, reason="transformers and accelerate are needed for a Trainer")
def test_transformers_trainer_callback_dumps_the_selected_steps(tmp_path):
    from xray.integrations.huggingface import XrayTrainerCallback

    cb = XrayTrainerCallback(tmp_path / "dump", step=[1, 2], task="statistics")
    trainer = _hf_train(tmp_path, cb)
    assert trainer.state.global_step == 3
    with load_dump(tmp_path / "dump" / "globalrank-0_localrank-0.h5") as d:
        assert d.complete and d.steps == [1, 2]
        for step in (1, 2):
            recs = [r for r in d.records if r.step == step]
            layer = {(r.op, r.direction) for r in recs if r.module == "model.layers.0"}
            assert layer == {("LlamaDecoderLayer", "forward"), ("LlamaDecoderLayer", "backward")}
            q = next(r for r in recs if r.module == "model.layers.0.self_attn.q_proj" and r.direction == "backward")
            assert q.inputs["params_grad.weight"].stats.numel == 1024 * 1024  # gradients are captured
        # the weights moved between the dumped steps: the optimizer ran between them
        w = [next(r for r in d.records if r.step == s and r.module == "model.layers.0.self_attn.q_proj"
                  and r.direction == "forward").params["weight"].stats.mean for s in (1, 2)]
        assert w[0] != w[1]


@pytest.mark.slow
@pytest.mark.skipif(not HF, reason="transformers and accelerate are needed for a Trainer")
def test_transformers_trainer_callback_takes_the_rank_from_the_trainer(tmp_path):
    from xray.integrations.huggingface import XrayTrainerCallback

    cb = XrayTrainerCallback(tmp_path / "dump", rank=[1], task="statistics")  # this process is rank 0
    _hf_train(tmp_path, cb, steps=1)
    assert cb.debugger.global_rank == 0 and not cb.debugger.rank_selected
    assert not list((tmp_path / "dump").glob("*.h5"))


def _lightning():
    try:
        import lightning as L
    except ImportError:
        import pytorch_lightning as L
    return L


@pytest.mark.slow
@pytest.mark.skipif(not LIGHTNING, reason="lightning is not installed (pip install lightning)")
def test_lightning_callback_dumps_the_selected_steps(tmp_path):
    L = _lightning()
    from xray.integrations.lightning import XrayLightningCallback

    class MLP(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024))

        def training_step(self, batch, batch_idx):
            (x,) = batch
            return torch.nn.functional.mse_loss(self.net(x), x)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(4 * 512, 1024)), batch_size=512)
    cb = XrayLightningCallback(tmp_path / "dump", step=[0, 2], task="tensor")
    trainer = L.Trainer(max_steps=3, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[cb],
                        default_root_dir=str(tmp_path))
    trainer.fit(MLP(), data)
    assert trainer.global_step == 3
    with load_dump(tmp_path / "dump" / "globalrank-0_localrank-0.h5") as d:
        assert d.steps == [0, 2]
        out = next(r for r in d.records if r.step == 2 and r.module == "net.2" and r.direction == "forward")
        (_, meta), = out.output_tensors()
        assert meta.shape == (512, 1024)
        saved = d.load_tensor(meta)
        assert saved.shape == (512, 1024) and float(saved.std()) == pytest.approx(meta.stats.std, rel=1e-4)
        assert any(r.step == 2 and r.module == "net.0" and r.direction == "backward" for r in d.records)


# -- a callback outlives a run: train() again, or a new Trainer, never raises into training ---------

def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, max_position_embeddings=16, use_cache=False)
    return LlamaForCausalLM(cfg)


class TinyTokens(TokenData):
    def __init__(self, n: int) -> None:
        self.ids = torch.randint(0, 64, (n, 16), generator=torch.Generator().manual_seed(0))


@pytest.mark.skipif(not HF, reason="transformers and accelerate are needed for a Trainer")
def test_transformers_callback_survives_a_second_train_and_a_new_trainer(tmp_path):
    """train() again, then a new Trainer with the same callback: each restarts at step 0, which
    raised "set_step(0): steps only advance" into training. Each run now has its own file, the
    first run's kept."""
    from transformers import Trainer, TrainingArguments

    from xray.integrations.huggingface import XrayTrainerCallback

    cb = XrayTrainerCallback(tmp_path / "dump", task="statistics")
    args = TrainingArguments(output_dir=str(tmp_path / "run"), max_steps=2, per_device_train_batch_size=1,
                             report_to=[], save_strategy="no", logging_strategy="no", use_cpu=True,
                             disable_tqdm=True, dataloader_num_workers=0)
    trainer = Trainer(model=_tiny_llama(), args=args, train_dataset=TinyTokens(2), callbacks=[cb])
    trainer.train()
    trainer.train()
    Trainer(model=_tiny_llama(), args=args, train_dataset=TinyTokens(2), callbacks=[cb]).train()
    stem = "globalrank-0_localrank-0.h5"
    for file in (tmp_path / "dump" / stem, tmp_path / "dump" / "run-2" / stem, tmp_path / "dump" / "run-3" / stem):
        with load_dump(file) as d:
            assert d.complete and d.steps == [0, 1], file


@pytest.mark.slow
@pytest.mark.skipif(not LIGHTNING, reason="lightning is not installed (pip install lightning)")
def test_lightning_callback_survives_a_new_trainer_and_a_debugger_error(tmp_path):
    L = _lightning()
    from xray.integrations.lightning import XrayLightningCallback

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(4, 4)

        def training_step(self, batch, batch_idx):
            (x,) = batch
            return torch.nn.functional.mse_loss(self.net(x), x)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    def fit(cb) -> int:
        data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4)), batch_size=4)
        trainer = L.Trainer(max_steps=2, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False, callbacks=[cb],
                            default_root_dir=str(tmp_path))
        trainer.fit(Tiny(), data)
        return trainer.global_step

    cb = XrayLightningCallback(tmp_path / "dump", task="statistics")
    assert fit(cb) == 2 and fit(cb) == 2
    for folder in (tmp_path / "dump", tmp_path / "dump" / "run-2"):
        with load_dump(folder / "globalrank-0_localrank-0.h5") as d:
            assert d.steps == [0, 1], folder
    bad = XrayLightningCallback(tmp_path / "bad", task="no such task")  # PrecisionDebugger refuses it
    with pytest.warns(RuntimeWarning, match="capture stopped at the start of training.*training goes on"):
        assert fit(bad) == 2
