"""The speak WebSocket: its wire format (`protocol`, pure), its rules (`session`, pure) and the
I/O around them (`connection`)."""
