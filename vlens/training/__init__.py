"""LoRA fine-tuning with the object-focused attention loss and export to Hugging Face (needs the
`train` extra: peft). The interventions study built on it is `vlens.studies.interventions`.

    from vlens.training import SFTConfig, train_sft, read_sft_folder, save_adapters, save_merged
    examples = read_sft_folder("data/syndot") + read_sft_folder("data/synpoly")
    result = train_sft(model, examples, SFTConfig(), out_dir="runs/sft")   # resumable
    save_merged(model, "runs/sft/merged")      # plain transformers loads it
"""

from vlens.training.data import SFTBatch, SFTExample, collate, example_from_sample, read_sft_folder
from vlens.training.export import load_adapters, merged_state_dict, save_adapters, save_merged
from vlens.training.lora import add_lora, lora_layers, lora_parameters
from vlens.training.sft import NonFiniteLossError, SFTConfig, SFTResult, train_sft

__all__ = [
    "NonFiniteLossError",
    "SFTBatch",
    "SFTConfig",
    "SFTExample",
    "SFTResult",
    "add_lora",
    "collate",
    "example_from_sample",
    "load_adapters",
    "lora_layers",
    "lora_parameters",
    "merged_state_dict",
    "read_sft_folder",
    "save_adapters",
    "save_merged",
    "train_sft",
]
