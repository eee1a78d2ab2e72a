"""GPU benchmarks: autofit against Lightning's and Hugging Face's batch-size finders on a 124M GPT."""
