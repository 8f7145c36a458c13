"""The app's own helpers (the only code that imports Streamlit). The pages beside this folder
only lay out and render; the computations they show live in `vitpe_core` (usable without
Streamlit). One module per concern:

* `cache`: the library's loaders and computations in Streamlit's caches; imported models;
* `viewsync`: the view in session_state and the URL, the share link;
* `widgets`: controls bound to the view (checkpoint, layer / head, patch, epoch);
* `picker`: the clickable patch picker;
* `uploads`: the sample or uploaded image and how it is fitted to a model;
* `output`: charts (PNG / SVG export) and data downloads;
* `loading`: loading the shown checkpoints, each failure said on the page;
* `import_form`: importing a pretrained ViT into the session;
* `explain`: each page's "What am I looking at?" (its text in `texts/<page>.md`);
* `messages`: escaped notes and the "no checkpoints" help;
* page sections: `position_panel` (compare), `stress_panel` (bias: rollout, stress test),
  `film` (similarity); `status` (the sidebar's server status);
* the server: `warmup` (imports before the first visitor), `paths` (deep-path redirects).
"""
