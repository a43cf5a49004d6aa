# cudnn_graph._execute declares nothing for other modules: its one function is pygraph.execute.
