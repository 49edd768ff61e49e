"""``hetrain advise``: measure the job briefly, simulate candidate configurations on what was measured, rank them.

:mod:`.profile` turns a short real run's record into a measured profile; :mod:`.candidates` lists the
configurations worth trying and simulates each on that profile; :mod:`.advice` ties the two together
(:func:`hetrain.advisor.advice.advise` is ``hetrain.advise``).
"""
