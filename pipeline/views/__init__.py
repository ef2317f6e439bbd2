"""Views of a finished run: explain, report (and its plots and HTML), diff, runs, gc, the dataset card and publish. They read run directories; they never plan or run steps."""
