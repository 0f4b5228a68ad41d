"""yoso_cuda: YOSO's hashing and LSH-cumulation ops as a compiled torch extension.

The compiled ops and their pure-PyTorch reference arrive with the YOSO and kernel issues; the
package exists now so the distribution's layout is final.
"""
