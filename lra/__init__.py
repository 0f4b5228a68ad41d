"""lra: the Long Range Arena benchmark (data, model, training, results) for the attention zoo."""
