"""HTTP serving: a Falcon WSGI app under gunicorn (gthread workers), one scheduler thread per model."""
