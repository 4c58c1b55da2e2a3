"""The toy world: tasks, character/WordPiece tokenizers, training, decoding, the shipped checkpoints
(toy/checkpoints) and the post-LN vs pre-LN results (toy/results)."""
