"""A module's appended signature and the certificates that may sign it.

The trailer (:mod:`.trailer`), the kernel's BER decoder and compiled grammars
(:mod:`.asn1`, :mod:`.asn1_machines`, :mod:`.oids`), its X.509 and PKCS#7 parsers
(:mod:`.x509`, :mod:`.pkcs7`), the public-key step (:mod:`.pubkey`), the signer search
(:mod:`.signers`), the host's trusted certificates (:mod:`.trust`), the running kernel's
keyrings (:mod:`.keyring`), key ids in words (:mod:`.keyid`), and ``module_sig_check``
over all of them (:mod:`.modsig`).
"""
