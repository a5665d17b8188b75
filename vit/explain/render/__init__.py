"""Drawing explanations: what :func:`~vit.explain.explain` computed, as pictures and pages.

- :mod:`~vit.explain.render.images`: the one conversion to ``uint8`` RGB and the one PNG encoder;
- :mod:`~vit.explain.render.overlay` and :mod:`~vit.explain.render.panels`: heatmap overlays, captioned panels with
  a numbered colour bar, grids; :mod:`~vit.explain.render.plots`: attention statistics against depth;
- :mod:`~vit.explain.render.report`: the self-contained HTML report (Jinja2 templates in ``assets/``);
- :mod:`~vit.explain.render.explorer` (payload, size budget, page) and :mod:`~vit.explain.render.explorer_codes`
  (the encoding): the interactive attention explorer.
"""
