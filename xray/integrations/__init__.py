"""PrecisionDebugger inside training frameworks: callbacks that start and stop it around each
training step, with the rank and step number taken from the framework's own state.

``xray.integrations.huggingface.XrayTrainerCallback`` (transformers.Trainer) and
``xray.integrations.lightning.XrayLightningCallback`` (Lightning). Each module imports its
framework, so importing this package imports neither.
"""
