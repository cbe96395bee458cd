"""The embedded model's training recipe (`vlens zoo train` / `vlens zoo evaluate`).

Architecture, word-level tokenizer and vocabulary, training data mix and held-out sets, the
training loop and its stage options (curriculum, vision growth, the dense vision objective),
evaluation and the model card. The shipped weights and their loader live in `vlens.zoo`.
"""
