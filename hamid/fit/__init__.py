"""hamid.fit"""
