"""Cross-cutting helpers below the model: the user-error type (`errors`), the `Result` protocol
(`results`), statistics (`stats`), non-finite checks (`finite`), atomic file I/O (`fileio`),
provenance, argument validation and image decoding (`images`). Nothing here imports the model.
"""
