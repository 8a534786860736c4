"""What a model's outputs mean: class-score recognition, declared tasks and their decoders."""
