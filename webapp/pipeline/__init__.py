"""The TVM work. Runs only inside the sandbox (webapp/sandbox.py):

python -m webapp.pipeline JOB_DIR
"""
