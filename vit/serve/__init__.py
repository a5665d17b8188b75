"""``vit serve``: a trained model behind HTTP (LitServe), with batching, explanations, metrics and the Open
Inference Protocol (V2).

- :mod:`vit.serve.model`: :class:`~vit.serve.model.ServeModel`, the one predictor the servers wrap (decoding,
  preprocessing as at evaluation, the calibrated temperature, top-k, explanations, a PyTorch or ONNX Runtime backend);
- :mod:`vit.serve.server`: the LitServe app (``POST /predict``, ``/info``, ``/metrics``, ``/health``, V2 endpoints,
  overload and shutdown rules);
- :mod:`vit.serve.page`: the web page (``GET /``);
- :mod:`vit.serve.command`: the command line.

Nothing is imported here: ``vit serve --help`` answers before torch loads.
"""
