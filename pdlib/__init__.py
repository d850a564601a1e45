"""pdlib: what happens to one request's token stream when another request's long prompt arrives.

python -m pdlib validate --model synthetic:tiny --prompt-tokens 300 --output-tokens 40 --chunk-size 64
"""

__version__ = "0.1.0"
