"""A real (small, weak) model behind an OpenAI-compatible endpoint on loopback, for the
benchmark and the optional test that run the Log Agent against it (`pip install '.[real-llm]'`)."""
