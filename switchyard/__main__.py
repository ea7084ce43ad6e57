from switchyard.cli import app

app()
