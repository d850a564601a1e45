"""Publishing: notebooks executed by papermill into fresh run folders, and their offline HTML pages."""
