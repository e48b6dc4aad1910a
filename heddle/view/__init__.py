"""The live web view of the engine, and its replay of saved runs (`heddle view`)."""
