"""Reports to frames, findings, tables and charts (pandas, Altair). Never imports the engine or MLX."""
