"""``vit serve``: a trained model behind an HTTP endpoint, with a web page to try it."""
