"""The analysts' report: CSV files, a JSON summary and one self-contained HTML page with plots."""
