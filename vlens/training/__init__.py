"""LoRA fine-tuning with L_focus (sft), export to Hugging Face (export), the ablation-study runner (study)."""
