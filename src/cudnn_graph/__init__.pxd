# Marks src/cudnn_graph as the Cython package cudnn_graph, so each module here is named cudnn_graph.<module>.
