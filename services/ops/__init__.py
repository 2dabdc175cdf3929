"""Operations on a whole data dir: snapshots.
"""
