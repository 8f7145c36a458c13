"""The app's own helpers (the only code that imports Streamlit): `cache` wraps the library's
loaders and computations in Streamlit's caches, `ui` holds the widgets, share links and
downloads every page uses. The pages beside this folder only lay out and render; the
computations they show live in `vitpe_core` (usable without Streamlit)."""
