"""demo: the Gradio web demo of gpt-serve (`python -m demo`, `gpt-serve demo`, `make demo`).

- `demo.app.build_demo(registry) -> gr.Blocks`: the page (loads nothing until asked).
- `demo.handlers.DemoHandlers`: the functions behind its events and the /generate API.
- `demo.progress`: request checking, the streaming generator with live stats, the yield throttle.
- the models come from `gpt_serve.serving.registry.ModelRegistry` (shared with the OpenAI-compatible API).
- `demo.attention`: per-head attention heat maps of the prompt (numpy colormap), its characters on the axes.
- `demo.captions`: what the page says in words (stats line, captions, labels).
- `demo.browser.mount_browser(app, model_dir)`: the in-browser page (`demo/web/`, onnxruntime-web) at /browser/.
- `demo.cli.main(argv)`: the command line.

Importing the package imports nothing heavy; `demo.app` imports gradio.
"""
