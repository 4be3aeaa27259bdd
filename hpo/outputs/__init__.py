"""What a sweep shows: the report (table and files), the optuna-dashboard figure and page, progress lines,
and a live curve CSV read as it grows (follow)."""
