"""The TVM work. Runs only inside the sandbox (webapp/machine/sandbox.py):

python -m webapp.pipeline JOB_DIR
"""
